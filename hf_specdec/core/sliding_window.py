"""Sliding-window attention layers under tree verification (Gemma 3, Mistral, Qwen2 with
``use_sliding_window``...).

In plain decoding transformers keeps a sliding-window layer's cache as its last ``window - 1`` entries
(``DynamicSlidingWindowLayer``) and applies the window in the masks it builds. The tree loops (``tree_decoding.py``,
``batch_decoding.py``, SPACE) break both assumptions: a verification forward passes its own 4D mask, which the models
use as it is, for every layer; and after it the cache is gathered to the accepted path (``kv_cache.compact_cache``),
which needs every entry of the step, where an evicting layer has already dropped some. So these loops:

- verify into a cache of full layers (:func:`verification_cache`): the empty sliding-window cache ``generate``
  prepared is replaced by a ``DynamicCache`` without config, whose layers keep everything (what transformers 5.13
  itself does for assisted generation, ``cache_implementation="dynamic_full"``; here written in place,
  ``hf_compat.OverallocatedLayer``). The cost: a sliding layer keeps its whole context for the generation, like a
  full-attention one;
- pass, in place of a tree mask, the masks of :class:`LayerMasks`: the tree mask with the window applied by token
  *positions* (a query at position ``p`` sees keys at ``p - window < k <= p``, transformers' rule, which for the
  accepted tokens is exactly what plain decoding sees; tree siblings and the holes of a ragged batch do not count),
  one 4D mask when every layer has the window (Mistral), or one per layer type when full-attention and sliding layers
  mix (Gemma 3, Qwen2: their models take ``{"full_attention": ..., "sliding_attention": ...}``).

Where a caller passes a cache of its own that already holds sliding-window entries, the loops keep it and verify
without a tree while the window would be crossed (``kv_cache.check_tree_support``): exact, but no speedup.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from ..errors import SpecDecError
from ..hf_compat import CACHE_LAYER_TYPES, overallocate_layers, overallocated_cache
from .tree import additive_mask

FULL, SLIDING = (
    "full_attention",
    "sliding_attention",
)  # transformers' layer type names (``config.layer_types``)


def layer_windows(model) -> list[int | None]:
    """Each attention layer's sliding window (``None``: full attention), by the rule transformers' ``DynamicCache``
    follows: ``config.layer_types`` where the model names them, else every layer windowed if ``sliding_window`` is
    set. Layer types other than full and sliding attention are a clear error."""
    config = model.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "attention_chunk_size", None):
        raise SpecDecError(
            f"tree verification does not support chunked attention ({config.model_type}: attention_chunk_size); "
            "use transformers' assisted generation for this model"
        )
    types = getattr(config, "layer_types", None) or [SLIDING if window else FULL] * config.num_hidden_layers
    other = sorted(set(types) - {FULL, SLIDING})
    if other:
        raise SpecDecError(
            f"tree verification supports full and sliding-window attention layers; {config.model_type} has "
            f"layers of type {other}"
        )
    return [window if kind == SLIDING and window else None for kind in types]


def verification_cache(model, cache: Cache | None) -> Cache:
    """The cache a tree loop verifies into. A caller's cache that holds entries (or has layers other than plain
    dynamic ones) is used as it is. Otherwise its full-attention layers are ``hf_compat.OverallocatedLayer``, which
    ``update`` in place (no copy of the whole cache per forward): ``cache`` missing, or empty with sliding-window
    layers (what ``generate`` prepares for such models), is replaced by a cache of such full layers (module
    docstring); an empty cache of plain ``DynamicLayer`` layers (what ``generate`` prepares for the others) gets them in
    place (``hf_compat.overallocate_layers``: the same object, so a caller's own empty cache is still the one filled).
    Either way the cache is a ``DynamicCache`` that a later ``generate`` can continue from."""
    if cache is None:
        cache = DynamicCache(config=model.config)  # transformers' own layers (recurrent ones stay refused)
    layers = getattr(cache, "layers", None) or []
    sliding = any(isinstance(layer, DynamicSlidingWindowLayer) for layer in layers)
    dynamic = all(type(layer) in CACHE_LAYER_TYPES for layer in layers)
    if sliding and dynamic and cache.get_seq_length() == 0:
        return overallocated_cache()
    overallocate_layers(cache)
    return cache


class LayerMasks:
    """The attention masks of a verification forward for ``model``'s layers (module docstring). Called with the
    boolean mask ``allowed`` ``(B or 1, 1, q, k)`` (True = may attend), the positions of its queries ``(B or 1, q)``
    and keys ``(B or 1, k)``; returns an additive 4D mask, or a dict of them per layer type."""

    def __init__(self, model):
        windows = layer_windows(model)
        kinds = set(windows)
        self.window = next((w for w in windows if w is not None), None)
        if len(kinds - {None}) > 1:
            raise SpecDecError(f"tree verification takes one sliding window per model; this one has {kinds}")
        self.mixed = self.window is not None and None in kinds
        if self.mixed and not getattr(model.config.get_text_config(decoder=True), "layer_types", None):
            raise SpecDecError(
                "this model mixes sliding-window and full-attention layers without naming them in "
                "config.layer_types; tree verification cannot give each its mask"
            )
        self.dtype = model.dtype

    @property
    def windowed(self) -> bool:
        return self.window is not None

    def __call__(self, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
        full = additive_mask(allowed, self.dtype)
        if self.window is None:
            return full
        near = query_positions[:, None, :, None] - key_positions[:, None, None, :] < self.window
        sliding = additive_mask(allowed & near, self.dtype)
        return {FULL: full, SLIDING: sliding} if self.mixed else sliding

    def after_prefix(self, allowed: torch.Tensor, query_positions: torch.Tensor, prefix_length: int):
        """The masks of a batch-1 step whose keys are ``prefix_length`` cached tokens at positions ``0..P-1`` (a
        compacted cache holds the sequence in order) and then the fed tokens (``query_positions``)."""
        if self.window is None:
            return additive_mask(allowed, self.dtype)
        cached = torch.arange(prefix_length, device=query_positions.device)[None]
        keys = torch.cat([cached.expand(query_positions.shape[0], -1), query_positions], dim=1)
        return self(allowed, query_positions, keys)
