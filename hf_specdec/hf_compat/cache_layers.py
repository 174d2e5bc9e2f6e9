"""hf_compat's ``cache_layers`` entry (the package docstring describes it): the fields of ``DynamicLayer`` /
``DynamicSlidingWindowLayer`` that compacting a cache rewrites, and :class:`OverallocatedLayer`, the in-place
cache layer the verification loops use."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from ..errors import SpecDecError

# an OverallocatedLayer's capacity is a multiple of this many entries (per row), at least one more than it holds
CHUNK_ENTRIES = 256


class OverallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that keeps its entries at the front of a preallocated buffer ``(batch, kv_heads,
    capacity, head_dim)``: ``update`` writes the new entries into the buffer in place instead of ``torch.cat``-ing
    the whole cache, and when they do not fit moves everything to a buffer of the next multiple of
    :data:`CHUNK_ENTRIES` (one copy per chunk of entries, not one per forward). ``keys`` / ``values`` are views of
    the buffer's first ``n`` entries, so the model, its masks and ``get_seq_length`` read exactly what a
    ``DynamicLayer`` would, bit for bit.

    :meth:`truncate` keeps the first ``n`` entries by moving the fill pointer (nothing is copied or freed). Whatever
    else replaces ``keys`` / ``values`` (``set_layer_entries``, ``crop``, ``batch_select_indices``, ...) is safe: a
    view of the buffer's first entries (a crop) is taken as a truncation, any other tensor is copied into a new buffer
    by the next ``update``. Writes land only past the entries the layer holds, so a view handed out earlier keeps its
    contents unless the layer was truncated below that view's length since (or compacted in place,
    ``kv_cache.compact_cache``). For inference: the in-place writes do not keep autograd's record of what an earlier
    forward read."""

    _key_buffer: torch.Tensor | None = None
    _value_buffer: torch.Tensor | None = None
    # the views this layer last set as ``keys`` / ``values``: anything else found there was set from outside
    _keys_view: torch.Tensor | None = None
    _values_view: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        """Entries per row the buffer holds before ``update`` moves to a larger one (0: no buffer yet)."""
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states`` / ``value_states`` ``(batch, kv_heads, q, head_dim)``; returns all the entries."""
        held = self._keys_view
        if held is None or self.keys is not held or self.values is not self._values_view:
            self._adopt(key_states, value_states)
            held = self._keys_view
        keys, values = self._key_buffer, self._value_buffer
        n = held.shape[-2]
        end = n + key_states.shape[-2]
        if end > keys.shape[-2] or key_states.shape[0] != keys.shape[0]:
            if key_states.shape[0] != keys.shape[0]:
                raise ValueError(f"a cache update of {key_states.shape[0]} rows into {keys.shape[0]} rows")
            keys, values = self._reallocate(held, self._values_view, key_states, value_states, end)
        keys[:, :, n:end] = key_states
        values[:, :, n:end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` entries: the fill pointer moves, the buffer stays."""
        if self._owns_entries():
            self._set_length(length)
        elif self.keys is not None:
            self.keys, self.values = self.keys[..., :length, :], self.values[..., :length, :]

    def _set_length(self, length: int) -> None:
        """``keys`` / ``values``: the buffers' first ``length`` entries (``as_strided``: the cheapest such view)."""
        keys, values = self._key_buffer, self._value_buffer
        size = (keys.shape[0], keys.shape[1], length, keys.shape[3])
        self.keys = self._keys_view = keys.as_strided(size, keys.stride())
        self.values = self._values_view = values.as_strided(size, values.stride())

    def reset(self) -> None:
        """Empty the layer and free its buffer (the next ``update`` initialises it again)."""
        self.keys = self.values = self._keys_view = self._values_view = None
        self._key_buffer = self._value_buffer = None
        self.is_initialized = False

    def _owns_entries(self) -> bool:
        """Whether ``keys`` / ``values`` are still the views this layer set."""
        return (
            self.is_initialized
            and self._keys_view is not None
            and self.keys is self._keys_view
            and self.values is self._values_view
        )

    def _adopt(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Take what ``keys`` / ``values`` hold now as the layer's entries: views of the buffer's first entries as
        they are; nothing (a new or reset layer, a crop to zero) in the buffer as it is, if ``key_states`` fit it;
        other tensors copied into a new buffer."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        if _is_prefix_of(keys, self._key_buffer) and _is_prefix_of(values, self._value_buffer):
            self._keys_view, self._values_view = keys, values
            return
        held = keys.dim() == 4 and keys.shape[-2] > 0
        if held or not (_fits(key_states, self._key_buffer) and _fits(value_states, self._value_buffer)):
            if not held:
                keys, values = key_states[..., :0, :], value_states[..., :0, :]
            self._reallocate(keys, values, key_states, value_states, keys.shape[-2] + key_states.shape[-2])
        self._set_length(keys.shape[-2] if held else 0)

    def _reallocate(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        end: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New buffers shaped like ``key_states`` / ``value_states`` with room for ``end`` entries (the next multiple
        of :data:`CHUNK_ENTRIES` above it), ``keys`` / ``values`` (the entries held) copied to their front."""
        capacity = (end // CHUNK_ENTRIES + 1) * CHUNK_ENTRIES
        buffers = []
        for held, new in ((keys, key_states), (values, value_states)):
            if held.shape[-2] and held.shape[:2] != new.shape[:2]:
                raise ValueError(
                    f"a cache update of shape {tuple(new.shape)} onto entries {tuple(held.shape)}"
                )
            buffer = new.new_empty(*new.shape[:2], capacity, new.shape[-1])
            if held.shape[-2]:
                buffer.narrow(-2, 0, held.shape[-2]).copy_(held)
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers
        return self._key_buffer, self._value_buffer


def _is_prefix_of(t: torch.Tensor | None, buffer: torch.Tensor | None) -> bool:
    """Whether ``t`` is a view of ``buffer``'s first ``t.shape[-2]`` entries (every row, head and channel)."""
    return (
        buffer is not None
        and t is not None
        and t.dim() == 4
        and t.data_ptr() == buffer.data_ptr()
        and t.stride() == buffer.stride()
        and t.shape[:2] == buffer.shape[:2]
        and t.shape[-1] == buffer.shape[-1]
        and t.shape[-2] <= buffer.shape[-2]
    )


def _fits(states: torch.Tensor, buffer: torch.Tensor | None) -> bool:
    """Whether ``states`` can be written into ``buffer`` as they are (same rows, heads, channels, dtype, device)."""
    return (
        buffer is not None
        and states.dtype == buffer.dtype
        and states.device == buffer.device
        and states.shape[:2] == buffer.shape[:2]
        and states.shape[-1] == buffer.shape[-1]
    )


def overallocated_cache() -> DynamicCache:
    """An empty ``DynamicCache`` whose layers, created as the model fills them, are :class:`OverallocatedLayer`."""
    cache = DynamicCache()
    Cache.__init__(cache, layer_class_to_replicate=OverallocatedLayer)
    return cache


def overallocate_layers(cache: Cache) -> bool:
    """Turn an empty cache of plain full-attention ``DynamicLayer`` layers (``DynamicCache()``, or what
    ``DynamicCache(config=...)`` builds for a model without sliding-window or recurrent layers: what ``generate``
    prepares) into one of :class:`OverallocatedLayer`, in place: the same object, its layers (and the class it
    creates them from) replaced. Returns whether it did; any other cache (offloaded, holding entries, other layer
    types) is left as it is."""
    layers = getattr(cache, "layers", None)
    replicate = getattr(cache, "layer_class_to_replicate", None)
    if layers is None or getattr(cache, "offloading", False) or replicate not in (None, DynamicLayer):
        return False
    if any(type(layer) is not DynamicLayer or layer.get_seq_length() for layer in layers):
        return False
    cache.layers[:] = [OverallocatedLayer() for _ in layers]
    if replicate is not None:
        cache.layer_class_to_replicate = OverallocatedLayer
    return True


def truncate_layer(layer, length: int) -> None:
    """Keep a dynamic cache layer's first ``length`` entries (an :class:`OverallocatedLayer` moves its fill
    pointer; the others keep views of their first entries)."""
    if type(layer) is OverallocatedLayer:
        layer.truncate(length)
    else:
        set_layer_entries(layer, layer.keys[..., :length, :], layer.values[..., :length, :])


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
