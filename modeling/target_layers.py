"""Drafter layers of the target's own architecture: the config and module classes a drafter layer is
built from, taken from the target's config through transformers' own registry (never from code in a checkpoint).

EDD's decoder (EDD, ACL 2025, §3.1) and GLIDE's decoder layers (GLIDE, arXiv:2402.02082, §4.1) are "a layer of the target":
a Gemma 3 target gets Gemma 3's ``(1 + w)`` norms, q/k norms, query scaling and sandwich norms, a Qwen2 target its
attention biases, a Phi-3 target its fused projections. Both drafters describe that layer by
:func:`layer_config_dict` (the target's text config with the drafter's depth), stored in their own config, and
rebuild it with :func:`build_layer_config`. Drafter layers always attend to their whole context
(``full_attention``): they are too few to trade context for a window.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

from hf_specdec.errors import SpecDecError

# Keys of a target config that describe the full stack or its provenance, dropped for a drafter's layers.
_STACK_KEYS = (
    "mlp_only_layers",
    "sliding_window_pattern",
    "no_rope_layers",
    "_name_or_path",
    "architectures",
    "quantization_config",
    "transformers_version",
)


def layer_config_dict(target: PreTrainedModel | PretrainedConfig, num_layers: int) -> dict:
    """The target's text config as a dict for a ``num_layers``-layer drafter of the same architecture: every
    layer ``full_attention`` where the architecture names layer types, no sliding window otherwise."""
    config = target.config if isinstance(target, PreTrainedModel) else target
    values = copy.deepcopy(config.get_text_config()).to_dict()
    for key in _STACK_KEYS:
        values.pop(key, None)
    if values.get("layer_types") is not None:
        values["layer_types"] = ["full_attention"] * num_layers
    elif values.get("sliding_window") is not None:
        values["sliding_window"] = None
    values.update(num_hidden_layers=num_layers, tie_word_embeddings=False, use_cache=True)
    return values


def build_layer_config(values: dict, what: str) -> PretrainedConfig:
    """The config object of :func:`layer_config_dict`'s dict, with sdpa attention (the drafters pass their own
    boolean masks: dual-block, tree, cached prefix). ``what`` names the drafter in errors."""
    values = dict(values)
    model_type = values.pop("model_type", None)
    if not model_type:
        raise SpecDecError(f"{what} config has no layer architecture; build it with its for_target(target)")
    values["attn_implementation"] = "sdpa"
    try:
        return AutoConfig.for_model(model_type, **values)
    except ValueError as exc:
        raise SpecDecError(
            f"{what}: the target's architecture {model_type!r} is not one this transformers release knows "
            f"({exc}); drafters are built only from transformers' own model classes"
        ) from None


def decoder_classes(config: PretrainedConfig, what: str) -> tuple[type, PreTrainedModel]:
    """The decoder-layer class of ``config``'s architecture and its base model built on the meta device (no
    memory, no weights): the classes a drafter layer, its norms and rotary embedding are made of."""
    with torch.device("meta"):
        try:
            base = AutoModel.from_config(config)
        except ValueError as exc:
            raise SpecDecError(
                f"{what}: no transformers base model for {config.model_type!r} ({exc})"
            ) from None
    layers = getattr(base, "layers", None)
    if layers is None or len(layers) == 0:
        raise SpecDecError(
            f"{what}: {type(base).__name__} has no `layers` list of decoder layers; this architecture "
            "cannot host a drafter layer"
        )
    return type(layers[0]), base
