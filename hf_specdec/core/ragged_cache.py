"""Ragged rows in one KV cache: every row of a batch accepts its own number of tokens per step.

A batch shares one ``DynamicCache`` of ``S`` entries per row, but row ``b`` holds only ``lengths[b]`` real tokens:
``valid[b, s]`` says which entries are real. Holes come from left padding (the prompt) and from the steps: each
verification forward feeds ``q`` tokens to every row (the longest row's root + tree, the others padded), and a row
keeps only its root and accepted nodes. After a step every row's kept entries are gathered to the front of the
step's block (:meth:`RaggedCache.keep`) and the block is cut to the longest row's; the rest of a shorter row's
block is a hole.

Holes are invisible to the model: every forward gets a 4D mask in which a query sees the valid entries of its own
row only (plus its tree ancestors and itself), and position ids count real tokens only (``lengths[b] + depth``). A
row therefore computes what it would compute alone, which is what makes the batch lossless per row. Left padding
and holes cost attention time; :meth:`RaggedCache.repack` right-aligns the rows and drops the columns that are holes
in every row (run by the loop when that drops more than :data:`REPACK_FRACTION` of the columns).

Rows that finish leave the batch (:meth:`RaggedCache.select_rows`) and stop costing compute. Only ``DynamicLayer``
caches (or ``hf_compat.OverallocatedLayer``, the same written in place into a preallocated buffer: what the tree
core verifies into when the caller passes no cache, ``sliding_window.verification_cache``; a step then writes its
block and gathers the kept entries in place, and only dropping, adding or repacking rows copies the cache) are
supported here: a model's sliding-window layers keep every entry too, their window is applied in the masks by
positions (:meth:`RaggedCache.entry_positions`, ``sliding_window.py``), where holes do not count.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from ..errors import SpecDecError
from ..hf_compat import FULL_CACHE_LAYER_TYPES, set_layer_entries, truncate_layer
from .tree import TokenTree, host_to_device

REPACK_FRACTION = 0.25  # repack when it would drop more than this fraction of the cache's columns


class RaggedCache:
    """A batch's KV cache with per-row validity. ``valid``: ``(B, S)`` bool, ``S`` = the cache's length. ``masks``
    (a ``sliding_window.LayerMasks``) turns the boolean masks into the model's when the tree core drives it."""

    def __init__(self, cache: Cache, masks=None):
        for i, layer in enumerate(getattr(cache, "layers", None) or []):
            if type(layer) not in FULL_CACHE_LAYER_TYPES:
                raise SpecDecError(
                    f"batched speculative decoding needs full-attention dynamic cache layers; layer {i} is a "
                    f"{type(layer).__name__} (static, quantized and offloaded caches cannot skip the holes of "
                    "ragged rows); let generate build its default cache, or run the rows one at a time"
                )
        if cache.get_seq_length() != 0:
            raise SpecDecError(
                "batched speculative decoding starts from an empty cache; do not pass past_key_values"
            )
        self.cache, self.masks = cache, masks
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=cache_device(cache))
        self.fresh = False  # the last forward was the prefill: the cache holds the prompt as fed

    # ------------------------------------------------------------------ the tree core's layout (tree_decoding.py)
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The prefill's ``fed``, position ids and masks (``masks``: a ``sliding_window.LayerMasks``)."""
        positions, allowed = self.prefill_inputs(attention_mask)
        self.fresh = True
        return input_ids, positions, self.masks(allowed, positions, positions)

    def step(self, trees: list[TokenTree], roots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A tree step's ``fed``, position ids and masks (:meth:`tree_inputs`)."""
        fed, positions, allowed = self.tree_inputs(trees, roots)
        keys = torch.cat([self.entry_positions(), positions], dim=1)
        return fed, positions, self.masks(allowed, positions, keys)

    def keep_accepted(self, offsets: list[list[int]]) -> None:
        """After any forward: :meth:`keep` (the prefill keeps its prompt as fed, holes for the padding)."""
        if self.fresh:
            self.fresh = False
        else:
            self.keep(offsets)

    def maybe_repack(self) -> None:
        """:meth:`repack` when the columns it drops (every row's holes but the longest row's real entries) exceed
        :data:`REPACK_FRACTION` of the cache: holes that only move (rows of different lengths) are left in place."""
        s = self.valid.shape[1]
        if s and s - int(self.lengths.max()) > REPACK_FRACTION * s:
            self.repack()

    def fits(self, fed: int) -> bool:
        """Every layer here keeps its entries (``__init__``), so any tree can be verified."""
        return True

    @property
    def length(self) -> int:
        """The cache's entries per row, holes included."""
        return self.valid.shape[1]

    def entry_positions(self) -> torch.Tensor:
        """``(B, S)``: each cache entry's position (its row's real tokens before it; a hole gets its predecessor's)."""
        return self.valid.long().cumsum(1) - 1

    @property
    def lengths(self) -> torch.Tensor:
        """Real tokens per row, ``(B,)``."""
        return self.valid.sum(1)

    def prefill_inputs(self, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids ``(B, P)`` and the boolean 4D mask ``(B, 1, P, P)`` of a left-padded prompt batch: a real
        token sees the real tokens up to itself; a pad sees only itself (so no row of the softmax is empty)."""
        real = attention_mask.bool()
        positions = (real.long().cumsum(-1) - 1).clamp_min(0)
        p = real.shape[1]
        causal = torch.ones(p, p, dtype=torch.bool, device=real.device).tril()
        mask = causal[None] & real[:, None, :]
        mask |= torch.eye(p, dtype=torch.bool, device=real.device)[None]
        self.valid = real.clone()
        return positions, mask[:, None]

    def tree_inputs(self, trees: list[TokenTree], roots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The verification inputs of one step: row ``b`` feeds ``[root_b, tree_b nodes]``, padded to the longest
        row with copies of the root that see only themselves. Returns ``fed`` and ``positions`` ``(B, q)`` and the
        boolean 4D mask ``(B, 1, q, S + q)``."""
        b, s = self.valid.shape
        q = 1 + max(len(t) for t in trees)
        device = self.valid.device
        fed = roots.reshape(b, 1).repeat(1, q)
        positions = self.lengths.reshape(b, 1).repeat(1, q)
        block = torch.eye(q, dtype=torch.bool, device=device).repeat(b, 1, 1)
        for row, tree in enumerate(trees):
            n = len(tree)
            if n:
                fed[row, 1 : 1 + n] = tree.tokens.to(device)
                positions[row, 1 : 1 + n] += tree.fed_depths()[1:].to(device)
                block[row, : 1 + n, : 1 + n] = tree.ancestor_mask().to(device)
        prefix = self.valid[:, None, :].expand(b, q, s)
        return fed, positions, torch.cat([prefix, block], dim=2)[:, None]

    def keep(self, offsets: list[list[int]]) -> None:
        """After a forward that fed ``q`` tokens per row: row ``b`` keeps the fed tokens at ``offsets[b]``
        (increasing), gathered to the front of the step's block; the block is cut to the longest row's. In place."""
        b, s = self.valid.shape
        if all(o == [0] for o in offsets):  # every row keeps its root only, in place: nothing to gather
            for layer in self.cache.layers:
                truncate_layer(layer, s + 1)
            self.append_column()
            return
        width = max(len(o) for o in offsets)
        device = self.valid.device
        # every row's offsets (padded with 0) and their number, in one copy to the device
        packed = host_to_device([[len(o), *o, *[0] * (width - len(o))] for o in offsets], device)
        index, real = packed[:, 1:] + s, torch.arange(width, device=device) < packed[:, :1]
        for layer in self.cache.layers:
            keys, values = layer.keys, layer.values
            idx = _per_entry(index, keys)
            keys[:, :, s : s + width], values[:, :, s : s + width] = (
                keys.gather(2, idx),
                values.gather(2, idx),
            )
            truncate_layer(layer, s + width)  # no copy: an OverallocatedLayer's fill pointer moves
        self.valid = torch.cat([self.valid, real], dim=1)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (indices, in order): finished rows leave the batch."""
        for layer in self.cache.layers:
            idx = rows.to(layer.keys.device)
            set_layer_entries(layer, layer.keys.index_select(0, idx), layer.values.index_select(0, idx))
        self.valid = self.valid.index_select(0, rows.to(self.valid.device))

    def append_column(self) -> None:
        """Every row keeps the one entry after its others (:meth:`keep` when no row accepted a node)."""
        self.valid = torch.cat([self.valid, self.valid.new_ones(self.valid.shape[0], 1)], dim=1)

    def append_rows(self, other: RaggedCache) -> None:
        """Add ``other``'s rows (a batch prefilled on its own) below this batch's: continuous batching's refill.
        The shorter of the two caches gets hole columns at its end, so no row's entries move."""
        width = max(self.length, other.length)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            keys = torch.cat([_holes_after(mine.keys, width), _holes_after(theirs.keys, width)], dim=0)
            values = torch.cat([_holes_after(mine.values, width), _holes_after(theirs.values, width)], dim=0)
            set_layer_entries(mine, keys, values)
        self.valid = torch.cat([_holes_after(self.valid, width), _holes_after(other.valid, width)], dim=0)

    def holes(self) -> float:
        """The fraction of the cache's entries that are holes."""
        return 1.0 - float(self.valid.float().mean()) if self.valid.numel() else 0.0

    def repack(self) -> None:
        """Right-align every row's real entries (order kept) and drop the columns that are holes in every row."""
        lengths = self.lengths
        width = int(lengths.max())
        s = self.valid.shape[1]
        # stable order: holes first, then the real entries in sequence order
        order = torch.argsort(self.valid.long() * (s + 1) + torch.arange(s, device=self.valid.device), dim=1)
        index = order[:, s - width :]
        for layer in self.cache.layers:
            keys, values = layer.keys, layer.values
            idx = _per_entry(index, keys)
            set_layer_entries(layer, keys.gather(2, idx), values.gather(2, idx))
        self.valid = torch.arange(width, device=self.valid.device)[None] >= (width - lengths)[:, None]

    def row_view(self, row: int) -> RowKV:
        """Row ``row``'s real entries as a per-layer ``(keys, values)`` sequence of batch 1 (what a drafter that
        reads the target's cache, GLIDE, takes in place of a ``Cache``)."""
        return RowKV(self, row)


def cache_device(cache: Cache) -> torch.device:
    """Where ``cache``'s layers live: the device of the first initialised layer's keys, else the CPU (an empty cache,
    filled by the prefill; ``prefill_inputs`` then takes the device of the prompt's mask)."""
    for layer in getattr(cache, "layers", None) or []:
        keys = getattr(layer, "keys", None)
        if keys is not None:
            return keys.device
    return torch.device("cpu")


def _holes_after(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t`` (entries along dim 2 of a cache tensor, or dim 1 of ``valid``) widened to ``width`` entries with zeros
    (holes) at the end."""
    dim = 1 if t.dim() == 2 else 2
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _per_entry(index: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """A ``(B, n)`` index of cache positions per row, expanded to ``gather`` whole entries of ``keys``
    ``(B, heads, S, head_dim)`` along the sequence."""
    return index.to(keys.device)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])


class RowKV:
    """One row of a :class:`RaggedCache`, holes removed: ``view[layer]`` is ``(keys, values)`` of shape
    ``(1, heads, lengths[row], head_dim)``, gathered on first access (a snapshot of the cache at that time)."""

    def __init__(self, ragged: RaggedCache, row: int):
        self.ragged, self.row = ragged, row
        self._layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.ragged.cache.layers)

    def __getitem__(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer not in self._layers:
            entry = self.ragged.cache.layers[layer]
            cols = self.ragged.valid[self.row].nonzero().flatten().to(entry.keys.device)
            keys = entry.keys[self.row : self.row + 1].index_select(2, cols)
            values = entry.values[self.row : self.row + 1].index_select(2, cols)
            self._layers[layer] = (keys, values)
        return self._layers[layer]

    def get_seq_length(self) -> int:
        return int(self.ragged.valid[self.row].sum())
