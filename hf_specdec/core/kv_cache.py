"""Compacting the target's KV cache to the accepted tree path.

After the verification forward the cache holds ``P`` prefix entries followed by one entry per fed token
``[root, node_0, ..., node_{n-1}]``. Only the root and the accepted nodes belong to the sequence, so for
every layer we gather those entries right after the prefix and drop the rest: the cache is then exactly
the one a plain forward over the accepted tokens would have produced (positions were ``P + depth`` and
each node attended only to the prefix and its ancestors). For a chain whose accepted nodes are a prefix
of the fed tokens this is HF's ``Cache.crop``.

Supported layers: ``DynamicLayer`` and ``hf_compat.OverallocatedLayer`` (full attention; the latter is what the
loops verify into when the caller passes no cache, ``sliding_window.verification_cache``) and
``DynamicSlidingWindowLayer`` while the whole
sequence still fits in its window (nothing was evicted). :func:`check_tree_support` says, before a tree
forward, whether it can run; the decoding loop then falls back to a plain one-token step (correct for
any cache) instead of corrupting a sliding-window layer. Static, quantized, offloaded and linear-attention
(recurrent) layers raise :class:`~hf_specdec.errors.SpecDecError`.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from ..errors import SpecDecError
from ..hf_compat import CACHE_LAYER_TYPES, truncate_layer
from .tree import host_to_device


def _layers(cache: Cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise SpecDecError(
            f"tree verification needs a transformers Cache with per-layer storage (got {type(cache).__name__}); "
            "let generate create its default DynamicCache"
        )
    return layers


def check_cache_supported(cache: Cache) -> None:
    """Raise a clear error for cache layers whose entries cannot be gathered to a tree path."""
    for i, layer in enumerate(_layers(cache)):
        if type(layer) not in CACHE_LAYER_TYPES:
            raise SpecDecError(
                f"cache layer {i} is a {type(layer).__name__}, which cannot be compacted to an accepted tree "
                "path; use the default dynamic cache (cache_implementation='dynamic', no quantized/static/"
                "offloaded cache) or a model without recurrent layers"
            )


def check_tree_support(cache: Cache, num_fed: int) -> bool:
    """True when feeding ``num_fed`` tokens with a custom tree mask and compacting afterwards is exact.

    Sliding-window layers keep only their last ``window - 1`` entries, and a custom 4D mask carries no
    window, so a tree is only exact while ``cached + num_fed <= window - 1`` for every such layer.
    """
    for layer in _layers(cache):
        if isinstance(layer, DynamicSlidingWindowLayer):
            if layer.get_seq_length() + num_fed > layer.sliding_window - 1:
                return False
    return True


def compact_cache(cache: Cache, prefix_length: int, keep: torch.Tensor | list[int]) -> None:
    """Keep, after the first ``prefix_length`` entries, only the fed tokens at offsets ``keep`` (increasing,
    relative to the prefix end), in that order; drop everything after them. In place: the kept entries are gathered
    into the slots right after the prefix, then the layer is truncated (``hf_compat.truncate_layer``: an
    ``OverallocatedLayer`` moves its fill pointer, the next step writes over the dropped entries). ``keep`` is checked
    on the host (a tensor is read once); the layer loop does one gather per layer and reads nothing back."""
    keep = keep.tolist() if isinstance(keep, torch.Tensor) else [int(k) for k in keep]
    m = len(keep)
    if any(b <= a for a, b in zip(keep, keep[1:])):
        raise SpecDecError(f"compact_cache needs increasing offsets, got {keep}")
    contiguous = m == 0 or keep[-1] == m - 1  # increasing and ending at m - 1 => 0..m-1: a crop
    index: dict[torch.device, torch.Tensor] = {}
    for layer in _layers(cache):
        if not getattr(layer, "is_initialized", False) or layer.keys is None or layer.keys.numel() == 0:
            continue
        if type(layer) not in CACHE_LAYER_TYPES:
            check_cache_supported(cache)
        length = layer.keys.shape[-2]
        if isinstance(layer, DynamicSlidingWindowLayer) and length != layer.get_seq_length():
            raise SpecDecError(
                "a sliding-window cache layer already evicted entries, so the tree path cannot be gathered; "
                "this is a bug in the caller (check_tree_support must be consulted before a tree forward)"
            )
        if m and prefix_length + keep[-1] >= length:
            raise SpecDecError(
                f"compact_cache: offset {keep[-1]} after prefix {prefix_length} is past the cache end {length}"
            )
        keys, values = layer.keys, layer.values
        if not contiguous:
            if keys.device not in index:
                index[keys.device] = host_to_device(keep, keys.device) + prefix_length
            idx = index[keys.device]
            keys[..., prefix_length : prefix_length + m, :] = keys.index_select(-2, idx)
            values[..., prefix_length : prefix_length + m, :] = values.index_select(-2, idx)
        truncate_layer(layer, prefix_length + m)


class PackedCache:
    """A batch of one in the tree core (``tree_decoding.py``): the cache holds the sequence in order, ``length``
    entries, no holes. A step feeds ``[root, tree nodes]`` after them and keeps the root and the accepted path
    (:func:`compact_cache`). The same interface as ``ragged_cache.RaggedCache``, which lays out a batch; this one
    also takes a caller's cache (``past`` prompt tokens in it already) and sliding-window layers that evict."""

    def __init__(self, cache: Cache, masks, past: int):
        self.cache, self.masks, self.length, self.fed = cache, masks, past, 0
        self.evicting = any(isinstance(layer, DynamicSlidingWindowLayer) for layer in _layers(cache))

    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        """The prompt tokens not cached yet, their positions; the model builds its own causal mask."""
        fed = input_ids[:, self.length :]
        self.fed = fed.shape[1]
        return fed, torch.arange(self.length, input_ids.shape[1], device=input_ids.device)[None], None

    def step(self, trees: list, roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, object]:
        """``[root, nodes]`` at positions ``length + depth``, with the tree mask after the cached prefix (no mask for
        an empty tree: a plain one-token step)."""
        (tree,) = trees
        fed, positions = tree.flat_tokens(roots[0]), tree.position_ids(self.length)
        self.fed = fed.shape[1]
        mask = (
            self.masks.after_prefix(tree.attention_mask(self.length), positions, self.length)
            if len(tree)
            else None
        )
        return fed, positions, mask

    def keep_accepted(self, offsets: list[list[int]]) -> None:
        """Keep the fed tokens at ``offsets[0]`` after the prefix; nothing moves when every fed token stays."""
        (keep,) = offsets
        if len(keep) < self.fed:
            compact_cache(self.cache, self.length, keep)
        self.length += len(keep)

    def fits(self, fed: int) -> bool:
        """Whether a tree of ``fed`` tokens can be verified and compacted exactly (:func:`check_tree_support`)."""
        return not self.evicting or check_tree_support(self.cache, fed)

    def row_view(self, row: int) -> Cache:
        return self.cache

    def maybe_repack(self) -> None:
        """No holes to drop."""

    def select_rows(self, rows: torch.Tensor) -> None:
        raise SpecDecError("a batch of one has no rows to drop")  # its only row finishing ends the loop
