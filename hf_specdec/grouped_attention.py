"""SDPA on grouped key/value heads under a mask: the attention half of ``apply_kernels`` (``kernels.py``).

A model with grouped-query attention (SmolLM2-135M: 9 query heads over 3 key/value heads; Llama 3, Qwen, Gemma 3)
stores one key/value head per group. transformers' ``sdpa`` attention hands them to
``torch.nn.functional.scaled_dot_product_attention`` as they are (``enable_gqa=True``) only when there is no
attention mask; with a mask (and more than one query token, from 5.23 on) it first copies every key and value head
once per query head of its group (``repeat_kv``). A verification forward always carries a mask (the draft tree's),
so on a CPU each of its steps copies the whole KV cache, every layer: after 2,000 tokens of SmolLM2-135M in fp32
that copy takes about half of the attention's time.

:func:`use_grouped_attention` switches a model to ``hf_specdec_sdpa``, registered through transformers' public
``AttentionInterface`` / ``AttentionMaskInterface``: the same masks, the same SDPA call, with ``enable_gqa=True``
under a mask as well (torch's CPU kernels take a mask with grouped heads and give the same numbers). Calls this does not
cover (no mask, another device, position biases, soft-capping, a paged cache) go to ``sdpa`` itself, unchanged.
Plain ``generate`` on the model then runs it too, so every method is checked against the model as it runs.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .hf_compat import attn_implementation

NAME = "hf_specdec_sdpa"
BASE = "sdpa"
_PREVIOUS = "_hf_specdec_attention_before"
_DELEGATED = ("position_bias", "softcap", "cache")  # sdpa's own features, for sdpa itself


def grouped_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: ``(B, H, q, D)`` query, ``(B, KV, k, D)`` key and value, the
    model's mask; returns ``(B, q, H, D)`` and no weights. A masked CPU call with grouped heads runs SDPA with
    ``enable_gqa=True``; every other call is ``sdpa``'s."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        attention_mask is None
        or groups == 1
        or query.device.type != "cpu"
        or kwargs.get("output_attentions")
        or any(kwargs.get(k) is not None for k in _DELEGATED)
    ):
        return _base()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _base():
    """transformers' own ``sdpa`` attention function (looked up once)."""
    from transformers import AttentionInterface

    return AttentionInterface()[BASE]


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if NAME not in AttentionInterface():
        AttentionInterface.register(NAME, grouped_sdpa_attention)
        AttentionMaskInterface.register(NAME, AttentionMaskInterface()[BASE])


def unavailable(model) -> str:
    """Why :func:`use_grouped_attention` would change nothing on ``model`` (``""`` if it would not)."""
    impl = attn_implementation(model)
    if impl == NAME:
        return ""
    if impl != BASE:
        return f"attention is {impl!r}; the grouped kernel replaces {BASE!r}"
    if not any(getattr(m, "num_key_value_groups", 1) > 1 for m in model.modules()):
        return "no attention layer groups its key/value heads"
    try:
        q, kv = torch.zeros(1, 2, 2, 4), torch.zeros(1, 1, 3, 4)
        F.scaled_dot_product_attention(
            q, kv, kv, attn_mask=torch.ones(2, 3, dtype=torch.bool), enable_gqa=True
        )
    except (TypeError, RuntimeError) as e:  # torch < 2.5 has no enable_gqa
        return f"this torch cannot run grouped heads under a mask ({e})"
    return ""


def use_grouped_attention(model) -> bool:
    """Switch ``model`` (an ``sdpa`` model with grouped key/value heads) to :data:`NAME`; ``False`` where
    :func:`unavailable` says why not. :func:`restore_attention` switches it back."""
    if attn_implementation(model) == NAME:
        return True
    if unavailable(model):
        return False
    _register()
    previous = attn_implementation(model)
    model.set_attn_implementation(NAME)
    if attn_implementation(model) != NAME:  # transformers declined the switch (it warns why)
        return False
    model.__dict__[_PREVIOUS] = previous
    return True


def restore_attention(model) -> None:
    """Undo :func:`use_grouped_attention` (nothing if it was not applied)."""
    previous = model.__dict__.pop(_PREVIOUS, None)
    if previous is not None and attn_implementation(model) == NAME:
        model.set_attn_implementation(previous)
