"""Selected-head attention capture for PLD+(a) (PLD+, arXiv:2412.01447, §4.2.1) and ``find-heads``.

A model on ``sdpa`` attention returns no attention weights; this computes the weights of a few selected heads next
to the model's own kernel, through a thin registered attention function (``_attention_with_selected_weights``),
so the model's outputs stay those of its own kernel.

Sliding-window layers (Gemma 3) are masked to their window, and their rows are left-padded with zeros to the
forward's full key length when their cache keeps only the window: every layer's row ``i`` then covers keys
``0 .. t`` of the whole context, as the callers index them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..core.generate_io import CAPTURE_PREFIX
from ..errors import SpecDecError
from ..hf_compat import attn_implementation, cache_of


@dataclass
class _Capture:
    heads_by_layer: dict[int, torch.Tensor]  # layer index -> query-head indices whose weights are wanted
    last_rows: int | None = None  # compute only the last `last_rows` query rows (None: all)
    keys: int | None = None  # the current forward's cached + fed tokens (set by a pre-hook on the model)


_CAPTURE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("pld_plus_capture", default=None)
_WRAPPER_PREFIX = CAPTURE_PREFIX


def _selected_weights(
    module, query: torch.Tensor, key: torch.Tensor, scaling: float | None, window: int | None = None
) -> torch.Tensor | None:
    """Softmax attention of the selected heads of ``module`` (``None`` when none is selected there).

    Batch size 1 and no padding (PLD+(a) runs on one row), a chain of fed tokens: query row ``i`` of ``q`` rows sits at key
    position ``k - q + i``, which gives the causal mask, and the sliding ``window`` if the layer has one (a query
    sees the ``window`` last positions, itself included, as transformers' mask). Shape ``(1, heads, rows, keys)``,
    float32, ``keys`` the whole context's (zeros on the left for the positions a sliding cache dropped).
    """
    capture = _CAPTURE.get()
    if capture is None:
        return None
    heads = capture.heads_by_layer.get(getattr(module, "layer_idx", None))
    if heads is None:
        return None
    n_q, n_kv = query.shape[1], key.shape[1]
    rows = query.shape[2] if capture.last_rows is None else min(capture.last_rows, query.shape[2])
    heads = heads.to(query.device)
    q = query[:, heads, query.shape[2] - rows :].float()
    k = key[:, heads // (n_q // n_kv)].float()  # grouped-query attention: query head -> its key/value head
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    n_keys = k.shape[2]
    positions = torch.arange(n_keys - rows, n_keys, device=scores.device)
    keys = torch.arange(n_keys, device=scores.device)[None, :]
    hidden = keys > positions[:, None]
    if window:
        hidden |= keys <= positions[:, None] - window
    weights = scores.masked_fill_(hidden, float("-inf")).softmax(dim=-1)
    if capture.keys is not None and capture.keys > n_keys:  # a sliding cache kept only the window's keys
        weights = torch.nn.functional.pad(weights, (capture.keys - n_keys, 0))
    return weights


def _note_keys(capture: _Capture):
    """A forward pre-hook on the model: the forward's key length, cached tokens plus the ones it feeds."""

    def hook(model, args, kwargs):
        fed = kwargs.get("input_ids", args[0] if args else None)
        fed = kwargs.get("inputs_embeds") if fed is None else fed
        cache = cache_of(kwargs)
        past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        capture.keys = None if fed is None else past + fed.shape[1]

    return hook


def _make_attention(base: str):
    from transformers import AttentionInterface

    base_fn = AttentionInterface()[base]

    def _attention_with_selected_weights(module, query, key, value, attention_mask, **kwargs):
        """The model's own ``base`` attention for the output, plus the selected heads' weights (or ``None``)."""
        kwargs.pop("output_attentions", None)  # the base kernel does not return weights; we do, below
        out, _ = base_fn(module, query, key, value, attention_mask, **kwargs)
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        return out, _selected_weights(module, query, key, kwargs.get("scaling"), window)

    return _attention_with_selected_weights


def _register_wrapper(base: str) -> str:
    """Register ``pld_plus|<base>`` (attention and mask functions) once; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    name = _WRAPPER_PREFIX + base
    if name not in AttentionInterface():
        AttentionInterface.register(name, _make_attention(base))
        masks = AttentionMaskInterface()
        if base in masks:
            AttentionMaskInterface.register(name, masks[base])
    return name


@contextlib.contextmanager
def capture_selected_attention(
    model, heads_by_layer: dict[int, torch.Tensor], last_rows: int | None = None
) -> Iterator[bool]:
    """Within the block, ``output_attentions=True`` returns the attention weights of the selected heads only.

    A model on ``eager`` attention already computes every weight; it is left as it is (yields ``False``: its
    ``outputs.attentions`` holds all layers and heads). Otherwise the model's attention implementation ``X`` is
    switched to ``pld_plus|X`` for the block: ``X`` itself computes the layer outputs (so generation is unchanged),
    and the selected heads' weights are computed next to it (yields ``True``: ``outputs.attentions`` holds one
    ``(1, len(heads), rows, keys)`` tensor per selected layer, in layer order).

    The switch lives on ``model.config`` and is undone on every exit from the block, exceptions included; during
    the block the model is switched for every caller, so two threads must not share a model while one is inside
    (e.g. mid-``generate`` with PLD+(a)).
    """
    from transformers import AttentionInterface

    base = attn_implementation(model)
    if base == "eager":
        if getattr(model.config.get_text_config(), "sliding_window", None):
            raise SpecDecError(
                "PLD+(a) cannot align the eager attention of a sliding-window model (its cache keeps only the "
                "window); load the model with attn_implementation='sdpa'"
            )
        yield False
        return
    if base.startswith(_WRAPPER_PREFIX):
        raise SpecDecError("capture_selected_attention cannot be nested on the same model")
    if base not in AttentionInterface():
        raise SpecDecError(
            f"PLD+(a) cannot read attention weights from attn_implementation={base!r}; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    capture = _Capture(heads_by_layer, last_rows)
    token = _CAPTURE.set(capture)
    hook = model.register_forward_pre_hook(_note_keys(capture), with_kwargs=True)
    try:
        model.set_attn_implementation(_register_wrapper(base))
        yield True
    finally:
        hook.remove()
        if attn_implementation(model) != base:
            model.set_attn_implementation(base)
        _CAPTURE.reset(token)
