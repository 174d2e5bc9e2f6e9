"""Timing a linear layer's shape on PyTorch's kernel and on oneDNN's packed one, and the report of what
``kernels.apply_kernels`` packed by those timings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .torch_private import pack_linear_weight, packed_linear

ROWS = (1, 2, 4, 8, 16)  # rows a linear is timed at: a plain step, and the verification sizes of drafts
# how much slower than PyTorch's linear a packed layer may be at one row: the spread of a best-of-5 timing
ONE_ROW_TOLERANCE = 0.02


@dataclass
class ShapeTiming:
    """One layer shape's best milliseconds per call by rows, PyTorch's default linear against oneDNN's."""

    shape: tuple[int, int]
    layers: int
    stock_ms: dict[int, float]
    onednn_ms: dict[int, float]

    @property
    def packed(self) -> bool:
        """Packed where oneDNN is faster over the rows timed and no slower at one row (plain decoding's step, which
        every method falls back to), up to :data:`ONE_ROW_TOLERANCE`."""
        one = min(self.stock_ms)
        return sum(self.onednn_ms.values()) < sum(self.stock_ms.values()) and self.onednn_ms[
            one
        ] <= self.stock_ms[one] * (1 + ONE_ROW_TOLERANCE)


@dataclass
class KernelReport:
    """What :func:`apply_kernels` did: ``kernels`` in force, the layers packed, and why where it did nothing."""

    kernels: str
    reason: str = ""
    packed_layers: int = 0
    linear_layers: int = 0
    extra_bytes: int = 0
    shapes: list[ShapeTiming] = field(default_factory=list)
    attention: str = ""  # what grouped_attention.py did, or why the attention is as it was

    def __str__(self) -> str:
        if self.kernels == "stock":
            grouped = f"; attention: {self.attention}" if self.attention.startswith("grouped") else ""
            return f"kernels: stock{f' ({self.reason})' if self.reason else ''}{grouped}"
        lines = [
            f"kernels: onednn, {self.packed_layers} of {self.linear_layers} linear layers packed"
            + (f" (+{self.extra_bytes / 2**20:.0f} MiB for shared weights)" if self.extra_bytes else "")
            + f"; attention: {self.attention or 'as it was'}"
        ]
        for s in self.shapes:
            ratio = ", ".join(f"{r}: {s.stock_ms[r]:.3f}/{s.onednn_ms[r]:.3f}" for r in sorted(s.stock_ms))
            lines.append(
                f"  {s.shape[0]}->{s.shape[1]} x{s.layers}: {'packed' if s.packed else 'kept'} "
                f"(ms stock/onednn by rows {ratio})"
            )
        return "\n".join(lines)


def _best_ms(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls, in ms: what the kernel costs, without the machine's other load."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


# (in, out, bias, dtype, threads, rows, repeats) -> time_shape's timings, timed once per process: every model
# packed here (a target, its drafters, SPACE's model) decides a shape alike
_TIMED: dict[tuple, tuple[dict, dict]] = {}


def time_shape(
    weight: torch.Tensor, bias: torch.Tensor | None, rows=ROWS, repeats: int = 5
) -> tuple[dict, dict]:
    """Best milliseconds of ``F.linear`` and of the packed linear with ``weight`` at each number of ``rows``,
    interleaved (the CPU's drift hits both alike), timed once per shape, dtype and thread count in a process.
    CPU only: the clock needs no device sync."""
    key = (*weight.shape, bias is not None, weight.dtype, torch.get_num_threads(), tuple(rows), repeats)
    if key not in _TIMED:
        _TIMED[key] = _time_shape(weight, bias, rows, repeats)
    return _TIMED[key]


def _time_shape(weight: torch.Tensor, bias: torch.Tensor | None, rows, repeats: int) -> tuple[dict, dict]:
    packed = pack_linear_weight(weight)
    stock, onednn = {}, {}
    for r in rows:
        x = torch.randn(r, weight.shape[1], dtype=weight.dtype)
        stock[r] = _best_ms(lambda x=x: F.linear(x, weight, bias), repeats)
        onednn[r] = _best_ms(lambda x=x: packed_linear(x, packed, bias), repeats)
    return stock, onednn
