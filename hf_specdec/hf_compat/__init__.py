"""Every transformers name hf_specdec uses that is not public API, in one place: this package.

Everything else uses public API only: EOS ids from ``generation_config.eos_token_id``, the attention registries as
the mappings ``AttentionInterface()`` / ``AttentionMaskInterface()``, ``model.set_attn_implementation`` to switch
the implementation, ``inspect.signature(model.forward)`` for ``logits_to_keep``, ``attn_implementation=`` as a
config keyword. What has no public form is below, one entry each (:data:`ENTRIES`); ``tests/test_hf_compat.py``
checks every entry against the installed transformers and fails naming the entry when it changes.

Entries:

- ``assisted_decoding``: ``GenerationMixin._assisted_decoding``, transformers' assisted loop (what
  ``generate(assistant_model=...)`` runs). hf_specdec wraps it (``core/assisted.py``) so that a GLIDE/EDD drafter
  as ``assistant_model`` runs the tree core's loop (any other call goes to transformers' loop as given); the wrapper
  reads the parameters in :data:`ASSISTED_DECODING_PARAMETERS`.
- ``generation_mode_hook``: ``GenerationMixin._validate_generation_mode``, the check ``generate`` runs on every call
  once it knows the generation mode, before preparing anything. hf_specdec wraps it (``core/assisted.py``) so that
  ``generate(assistant_model=<an hf_specdec drafter>, num_beams=2, ...)`` is refused by name
  (``generate_io.check_generation_mode``) instead of running beam search without the drafter; the wrapper reads the
  parameters in :data:`VALIDATE_GENERATION_MODE_PARAMETERS`.
- ``attn_implementation``: ``config._attn_implementation``, the attention implementation a model runs (5.23 has
  a public setter, ``set_attn_implementation``, but no public getter).
- ``cache_layers``: the fields of ``DynamicLayer`` / ``DynamicSlidingWindowLayer`` that compacting a cache to an
  accepted tree path rewrites (``keys``, ``values``, ``cumulative_length``); only these exact types are rewritten.
  :class:`OverallocatedLayer` is a ``DynamicLayer`` whose ``update`` writes into a preallocated buffer instead of
  concatenating (the cache the tree loops verify into when the caller passes none, :func:`overallocate_layers`, and
  the continuous-batching corpus loop's, :func:`overallocated_cache`); it relies on ``DynamicLayer``'s
  ``lazy_initialization(key_states, value_states)``, on ``update`` returning the layer's whole ``(keys, values)``,
  on ``crop`` leaving views of the first entries, and on a ``Cache`` keeping its layers in the list ``layers`` and
  the class it creates them from in ``layer_class_to_replicate``.
- ``cache_argument``: the name under which ``generate`` keeps the cache in its ``model_kwargs`` (what
  ``_assisted_decoding``, ``custom_generate`` loops and a ``CandidateGenerator``'s ``get_candidates`` receive) and
  passes it to the model's forward: ``past_key_values`` through 5.23, ``cache`` from 5.24 (where ``past_key_values``
  is only a deprecated alias of ``generate``'s and the models' keyword, not a key of ``model_kwargs``), and the
  field of ``generate``'s output that holds it (``GenerateDecoderOnlyOutput``). Read from the parameters of
  ``GenerationMixin.prepare_inputs_for_generation`` (:data:`CACHE_ARGUMENT`, :func:`cache_of`).
- ``decoder_layers``: the conventions of transformers' decoder layers that GLIDE builds its layers from
  (``modeling/glide_layers.py``): a layer's submodules ``self_attn``, ``mlp``, ``input_layernorm``,
  ``post_attention_layernorm`` (and Gemma's ``pre_/post_feedforward_layernorm``), an attention module's call
  ``(hidden_states, position_embeddings, attention_mask, <cache_argument>)`` returning ``(output, weights)`` and its
  ``scaling``, and the rotary embedding's call ``(x, position_ids[, layer_type])``.
"""

from __future__ import annotations

import inspect

import torch
from transformers.generation.utils import GenerationMixin

from ..errors import SpecDecError
from .cache_layers import (
    CACHE_LAYER_TYPES,
    CHUNK_ENTRIES,
    FULL_CACHE_LAYER_TYPES,
    OverallocatedLayer,
    overallocate_layers,
    overallocated_cache,
    set_layer_entries,
    truncate_layer,
)

ENTRIES = (
    "assisted_decoding",
    "generation_mode_hook",
    "attn_implementation",
    "cache_layers",
    "cache_argument",
    "decoder_layers",
)

__all__ = [
    "ENTRIES",
    "CACHE_ARGUMENT",
    "cache_of",
    "CACHE_LAYER_TYPES",
    "CHUNK_ENTRIES",
    "FULL_CACHE_LAYER_TYPES",
    "overallocate_layers",
    "overallocated_cache",
    "SANDWICH_NORMS",
    "attention_module_call",
    "decoder_layer_parts",
    "rotary_for_layer_type",
    "assisted_decoding_arguments",
    "assisted_decoding_hook",
    "attn_implementation",
    "generation_mode_arguments",
    "generation_mode_hook",
    "set_assisted_decoding_hook",
    "set_generation_mode_hook",
    "set_layer_entries",
    "truncate_layer",
    "OverallocatedLayer",
    "overallocated_cache",
    "overallocate_layers",
]


def _bind(original, model, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name (``self`` first), bound to ``original``'s signature, defaults filled in."""
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


# ------------------------------------------------------------------ assisted_decoding
ORIGINAL_ASSISTED_DECODING = GenerationMixin._assisted_decoding
# the parameters (after self) the wrapper reads from a call, plus the ``**model_kwargs`` it forwards; every other call
# is passed through to the original unchanged
ASSISTED_DECODING_PARAMETERS = (
    "input_ids",
    "logits_processor",
    "stopping_criteria",
    "generation_config",
    "synced_gpus",
    "streamer",
    "assistant_model",
)


def assisted_decoding_hook():
    """The method ``generate`` runs for assisted generation (whatever is installed now)."""
    return GenerationMixin._assisted_decoding


def set_assisted_decoding_hook(hook) -> None:
    """Install ``hook(self, *args, **kwargs)`` as ``GenerationMixin._assisted_decoding``."""
    GenerationMixin._assisted_decoding = hook


def assisted_decoding_arguments(model, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """A call's named arguments (bound to transformers' own signature, defaults filled in, ``self`` left out) and
    its ``**model_kwargs``."""
    signature = inspect.signature(ORIGINAL_ASSISTED_DECODING)
    bound = signature.bind(model, *args, **kwargs)
    bound.apply_defaults()
    named, extra = {}, {}
    for name, value in list(bound.arguments.items())[1:]:
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            extra = dict(value)
        else:
            named[name] = value
    return named, extra


# ------------------------------------------------------------------ generation_mode_hook
ORIGINAL_VALIDATE_GENERATION_MODE = GenerationMixin._validate_generation_mode
# the parameters (after self) the wrapper reads; the call is passed through to the original unchanged
VALIDATE_GENERATION_MODE_PARAMETERS = ("generation_mode", "generation_config", "generation_mode_kwargs")


def generation_mode_hook():
    """The method ``generate`` calls to validate its generation mode (whatever is installed now)."""
    return GenerationMixin._validate_generation_mode


def set_generation_mode_hook(hook) -> None:
    """Install ``hook(self, *args, **kwargs)`` as ``GenerationMixin._validate_generation_mode``."""
    GenerationMixin._validate_generation_mode = hook


def generation_mode_arguments(model, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name, bound to transformers' own signature (defaults filled in)."""
    return _bind(ORIGINAL_VALIDATE_GENERATION_MODE, model, args, kwargs)


# ------------------------------------------------------------------ attn_implementation
def attn_implementation(model) -> str | None:
    """The attention implementation ``model`` (or a config) runs now (``"sdpa"``, ``"eager"``, ...)."""
    config = getattr(model, "config", model)
    return config._attn_implementation


# ------------------------------------------------------------------ cache_layers: hf_compat/cache_layers.py


# ------------------------------------------------------------------ cache_argument
_OLD_CACHE_ARGUMENT = "past_key_values"
CACHE_ARGUMENT = (
    "cache"
    if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else _OLD_CACHE_ARGUMENT
)


def cache_of(kwargs: dict | None):
    """The cache in ``kwargs`` (``generate``'s ``model_kwargs``, a forward's keyword arguments): under
    :data:`CACHE_ARGUMENT`, else under the old ``past_key_values`` (a direct caller's); ``None`` when there is none."""
    kwargs = kwargs or {}
    cache = kwargs.get(CACHE_ARGUMENT)
    return kwargs.get(_OLD_CACHE_ARGUMENT) if cache is None else cache


# ------------------------------------------------------------------ decoder_layers
LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
SANDWICH_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")  # Gemma 2 / 3


def decoder_layer_parts(layer: torch.nn.Module, what: str) -> dict[str, torch.nn.Module]:
    """A decoder layer's submodules by name: :data:`LAYER_PARTS`, plus :data:`SANDWICH_NORMS` where the layer has
    them. A layer with any other submodule holding weights is of a form we do not rebuild: a clear error."""
    children = dict(layer.named_children())
    known = LAYER_PARTS + (SANDWICH_NORMS if all(n in children for n in SANDWICH_NORMS) else ())
    unknown = [n for n, m in children.items() if n not in known and any(True for _ in m.parameters())]
    missing = [n for n in LAYER_PARTS if n not in children]
    if missing or unknown:
        raise SpecDecError(
            f"{what} cannot build a layer like {type(layer).__name__}: "
            + (f"it has no {missing}" if missing else f"it has submodules {unknown} beyond {list(known)}")
            + "; its supported layers are pre-norm (Llama, Mistral, Qwen2/3, Phi-3) or Gemma's sandwich norms"
        )
    return {name: children[name] for name in known}


def attention_module_call(
    attention, hidden_states, position_embeddings, attention_mask, cache
) -> torch.Tensor:
    """A transformers attention module's output for ``hidden_states`` (its weights are not asked for)."""
    out, _ = attention(
        hidden_states=hidden_states,
        position_embeddings=position_embeddings,
        attention_mask=attention_mask,
        **{CACHE_ARGUMENT: cache},
    )
    return out


def rotary_for_layer_type(rotary: torch.nn.Module, layer_type: str = "full_attention"):
    """``rotary(x, position_ids) -> (cos, sin)`` for layers of ``layer_type``: models with several layer types
    (Gemma 3: sliding and full attention, each its own RoPE base) take it as a third argument."""
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        return lambda x, position_ids: rotary(x, position_ids, layer_type)
    return rotary
