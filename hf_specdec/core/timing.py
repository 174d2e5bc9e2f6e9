"""Device-correct wall-clock timing, the one helper behind every measured cost (issue #18).

CUDA kernels run asynchronously: ``time.perf_counter()`` right after a forward measures the launch, not the work.
Every timed region therefore starts and ends with :func:`clock`, which first waits for the device to finish what
is queued (``torch.cuda.synchronize(device)`` on a CUDA device; nothing on the CPU, whose work is synchronous).
Users: the verification cost curve (``core/verify_cost.py``: CAPE's trim, PLD+'s adaptive ``K``), the PCT
``StepTimer``'s ``s_d`` / ``s_t`` (``edd/tree_proposer.py``), the drafter cost c (``core/drafter_cost.py``: the
bench and draft-vocab), and the reported statistics: the decoding loops' draft / verify / total times
(``core/tree_decoding.py``, ``space/decoding.py``, the GLIDE / EDD chain generators) and the bench's timed
generations and ``ForwardMeter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def device_of(model) -> torch.device:
    """The device ``model``'s parameters live on (a tensor's own device for a tensor)."""
    if isinstance(model, torch.Tensor):
        return model.device
    return next(model.parameters()).device


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work (CUDA only; a no-op elsewhere)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device | str) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work: ``clock(d) - t0`` times a region."""
    synchronize(device)
    return time.perf_counter()


def untimed(device: torch.device | str) -> float:
    """:func:`clock`'s stand-in in a loop whose caller asked for no statistics: no device sync, no timing (0.0)."""
    return 0.0


def seconds(fn: Callable[[], object], device: torch.device | str) -> float:
    """Seconds of one call of ``fn()`` on ``device``."""
    t0 = clock(device)
    fn()
    return clock(device) - t0


def median(samples: list[float]) -> float:
    """The middle of ``samples`` (the upper one of an even count): what a cost takes of its timed samples."""
    return sorted(samples)[len(samples) // 2]
