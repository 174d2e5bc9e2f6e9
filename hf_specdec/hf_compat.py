"""Every transformers name hf_specdec uses that is not public API, in one place (issue #18).

Everything else uses public API only: EOS ids from ``generation_config.eos_token_id``, the attention registries as
the mappings ``AttentionInterface()`` / ``AttentionMaskInterface()``, ``model.set_attn_implementation`` to switch
the implementation, ``inspect.signature(model.forward)`` for ``logits_to_keep``, ``attn_implementation=`` as a
config keyword. What has no public form is below, one entry each (:data:`ENTRIES`); ``tests/test_hf_compat.py``
checks every entry against the installed transformers and fails naming the entry when it changes.

Entries:

- ``candidate_generator_hook``: ``GenerationMixin._get_candidate_generator``, the method transformers' assisted
  loop asks for its ``CandidateGenerator``. hf_specdec wraps it (``core/assisted.py``) so that GLIDE/EDD drafters
  supply their own generator.
- ``assisted_decoding``: ``GenerationMixin._assisted_decoding``, transformers' assisted loop (what
  ``generate(assistant_model=...)`` runs). PLD+ runs it with its own generator (the model instance answers
  ``_get_candidate_generator`` with it for the duration of the call), and hf_specdec wraps it (``core/assisted.py``)
  so that a batch with a GLIDE/EDD drafter as ``assistant_model`` runs the batched tree loop instead of
  transformers' "batch_size = 1" error; the wrapper reads the parameters in :data:`ASSISTED_DECODING_PARAMETERS`.
- ``generation_mode_hook``: ``GenerationMixin._validate_generation_mode``, the check ``generate`` runs on every call
  once it knows the generation mode, before preparing anything. hf_specdec wraps it (``core/assisted.py``) so that
  ``generate(assistant_model=<an hf_specdec drafter>, num_beams=2, ...)`` is refused by name
  (``generate_io.check_generation_mode``) instead of running beam search without the drafter; the wrapper reads the
  parameters in :data:`VALIDATE_GENERATION_MODE_PARAMETERS`.
- ``attn_implementation``: ``config._attn_implementation``, the attention implementation a model runs (5.23 has
  a public setter, ``set_attn_implementation``, but no public getter).
- ``cache_layers``: the fields of ``DynamicLayer`` / ``DynamicSlidingWindowLayer`` that compacting a cache to an
  accepted tree path rewrites (``keys``, ``values``, ``cumulative_length``); only these exact types are rewritten.
  :class:`OverallocatedLayer` is a ``DynamicLayer`` whose ``update`` writes into spare capacity instead of
  concatenating (the continuous-batching corpus loop's cache, :func:`overallocated_cache`); it relies on
  ``DynamicLayer``'s ``lazy_initialization`` and on ``update`` returning the layer's whole ``(keys, values)``.
- ``decoder_layers``: the conventions of transformers' decoder layers that GLIDE builds its layers from
  (``modeling/glide_layers.py``): a layer's submodules ``self_attn``, ``mlp``, ``input_layernorm``,
  ``post_attention_layernorm`` (and Gemma's ``pre_/post_feedforward_layernorm``), an attention module's call
  ``(hidden_states, position_embeddings, attention_mask, past_key_values)`` returning ``(output, weights)`` and its
  ``scaling``, and the rotary embedding's call ``(x, position_ids[, layer_type])``.
"""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation.utils import GenerationMixin

from .errors import SpecDecError

ENTRIES = (
    "candidate_generator_hook",
    "assisted_decoding",
    "generation_mode_hook",
    "attn_implementation",
    "cache_layers",
    "decoder_layers",
)

__all__ = [
    "ENTRIES",
    "CACHE_LAYER_TYPES",
    "SANDWICH_NORMS",
    "attention_module_call",
    "decoder_layer_parts",
    "rotary_for_layer_type",
    "assisted_decoding",
    "assisted_decoding_arguments",
    "assisted_decoding_hook",
    "attn_implementation",
    "candidate_generator_arguments",
    "candidate_generator_hook",
    "generation_mode_arguments",
    "generation_mode_hook",
    "set_assisted_decoding_hook",
    "set_generation_mode_hook",
    "set_candidate_generator_hook",
    "set_layer_entries",
]

# ------------------------------------------------------------------ candidate_generator_hook
ORIGINAL_GET_CANDIDATE_GENERATOR = GenerationMixin._get_candidate_generator
# the parameters (after self) we read from a call; everything is passed through to the original unchanged
CANDIDATE_GENERATOR_PARAMETERS = (
    "generation_config",
    "input_ids",
    "logits_processor",
    "model_kwargs",
    "assistant_model",
)


def candidate_generator_hook():
    """The method transformers' assisted loop calls for its candidate generator (whatever is installed now)."""
    return GenerationMixin._get_candidate_generator


def set_candidate_generator_hook(hook) -> None:
    """Install ``hook(self, *args, **kwargs)`` as ``GenerationMixin._get_candidate_generator``."""
    GenerationMixin._get_candidate_generator = hook


def _bind(original, model, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name (``self`` first), bound to ``original``'s signature, defaults filled in."""
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def candidate_generator_arguments(model, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name, bound to transformers' own signature (defaults filled in)."""
    return _bind(ORIGINAL_GET_CANDIDATE_GENERATOR, model, args, kwargs)


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


def assisted_decoding(model, generator, *args, **kwargs):
    """transformers' ``_assisted_decoding`` loop with ``generator`` as its candidate generator: for the duration of
    the call the model *instance* answers ``_get_candidate_generator`` with it (removed afterwards, on every exit
    path; the class and other models are untouched)."""
    if "_get_candidate_generator" in vars(model):
        raise SpecDecError("PLD+ generate is already running on this model (re-entrant call)")
    model._get_candidate_generator = lambda *_, **__: generator
    try:
        return model._assisted_decoding(*args, **kwargs)
    finally:
        del model._get_candidate_generator


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


# ------------------------------------------------------------------ cache_layers
# the entries an OverallocatedLayer reserves beyond what it holds when it reallocates
SPARE_ENTRIES = 64


class OverallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that keeps its entries at the front of a larger buffer, so that ``update`` writes the new
    entries into spare capacity instead of ``torch.cat``-ing the whole cache: a one-token step then moves one entry
    per row, not all of them (at 32 rows of 1200 entries the concatenation of keys and values was as long as the
    attention itself; docs/corpus.md). ``keys`` / ``values`` are views of the buffer's first ``n`` entries, so the
    layer reads and reports exactly what a ``DynamicLayer`` would, bit for bit.

    Whatever replaces ``keys`` / ``values`` (``set_layer_entries``, ``crop``, ``batch_select_indices``, ...) is safe:
    when they are no longer a prefix of the buffer, the next ``update`` copies them into a new one. A prefix view
    (a crop, or ``keys[:, :, :n]`` after an in-place gather) is written after in place, which overwrites only
    entries the layer no longer holds."""

    _buffer: tuple[torch.Tensor, torch.Tensor] | None = None

    def _holds_prefix(self, needed: int) -> bool:
        if self._buffer is None or self.keys is None or self.keys.dim() != 4:
            return False
        same = (
            t.data_ptr() == b.data_ptr() and t.stride() == b.stride() and t.shape[:2] == b.shape[:2]
            for t, b in zip((self.keys, self.values), self._buffer)
        )
        return all(same) and needed <= self._buffer[0].shape[-2]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        end = n + key_states.shape[-2]
        if not self._holds_prefix(end):
            capacity = end + SPARE_ENTRIES
            buffer = []
            for old, new in ((self.keys, key_states), (self.values, value_states)):
                b = new.new_empty(*new.shape[:2], capacity, new.shape[-1])
                if n:
                    b[:, :, :n] = old
                buffer.append(b)
            self._buffer = (buffer[0], buffer[1])
        keys, values = self._buffer
        keys[:, :, n:end] = key_states
        values[:, :, n:end] = value_states
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values


def overallocated_cache() -> DynamicCache:
    """An empty ``DynamicCache`` whose layers, created as the model fills them, are :class:`OverallocatedLayer`."""
    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=OverallocatedLayer)
    return cache


FULL_CACHE_LAYER_TYPES = (DynamicLayer, OverallocatedLayer)  # full-attention layers that keep every entry
# the exact types whose fields we rewrite
CACHE_LAYER_TYPES = (*FULL_CACHE_LAYER_TYPES, DynamicSlidingWindowLayer)


def set_layer_entries(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Replace a dynamic cache layer's entries (the layer then holds ``keys.shape[-2]`` tokens)."""
    if type(layer) not in CACHE_LAYER_TYPES:
        raise SpecDecError(f"cannot rewrite a {type(layer).__name__} cache layer (only {CACHE_LAYER_TYPES})")
    layer.keys, layer.values = keys, values
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length = keys.shape[-2]


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
        past_key_values=cache,
    )
    return out


def rotary_for_layer_type(rotary: torch.nn.Module, layer_type: str = "full_attention"):
    """``rotary(x, position_ids) -> (cos, sin)`` for layers of ``layer_type``: models with several layer types
    (Gemma 3: sliding and full attention, each its own RoPE base) take it as a third argument."""
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        return lambda x, position_ids: rotary(x, position_ids, layer_type)
    return rotary
