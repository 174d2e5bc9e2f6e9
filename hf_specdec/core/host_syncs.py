"""Counting host syncs: the device-to-host reads a decoding loop makes.

On a GPU every read of a tensor's value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``bool()``,
``int()``, ``float()``, using a tensor as an index) waits for the device to finish everything queued before it: the
loop stalls, and the device idles while the host decides. gpt-fast's rule is one such read per step, the one that
decides what to emit. On a CPU these reads cost nothing, so they are invisible in timings; this counter makes them
visible on any machine: inside :class:`HostSyncCounter` every such call on a ``torch.Tensor`` (and every
``torch.cuda.synchronize``) is counted, except inside the model forwards the caller marks with :meth:`paused`
(a model's own internals are the model's business). It patches ``torch.Tensor`` for the duration of the block, so
use it in tests and in the bench's untimed counting pass only.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSyncCounter:
    """``with HostSyncCounter() as syncs: ...`` then ``syncs.total`` (and ``syncs.by_kind``, a ``Counter``)."""

    def __init__(self):
        self.by_kind: Counter[str] = Counter()
        self._paused = 0
        self._saved: dict[str, object] = {}

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Do not count inside this block (a model forward)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def pause(self) -> None:
        self._paused += 1

    def resume(self) -> None:
        self._paused -= 1

    def _wrap(self, kind: str, original):
        counter = self

        def counted(*args, **kwargs):
            if not counter._paused:
                counter.by_kind[kind] += 1
            return original(*args, **kwargs)

        return counted

    def __enter__(self) -> HostSyncCounter:
        for kind in READS:
            self._saved[kind] = torch.Tensor.__dict__.get(kind)
            setattr(torch.Tensor, kind, self._wrap(kind, getattr(torch.Tensor, kind)))
        self._saved["synchronize"] = torch.cuda.synchronize
        torch.cuda.synchronize = self._wrap("synchronize", torch.cuda.synchronize)
        return self

    def __exit__(self, *exc) -> None:
        for kind in READS:
            original = self._saved.pop(kind)
            if original is None:
                delattr(torch.Tensor, kind)
            else:
                setattr(torch.Tensor, kind, original)
        torch.cuda.synchronize = self._saved.pop("synchronize")
