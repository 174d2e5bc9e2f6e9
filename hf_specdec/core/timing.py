"""Device-correct wall-clock timing, the one helper behind every measured cost.

CUDA kernels run asynchronously: ``time.perf_counter()`` right after a forward measures the launch, not the work.
Every timed region therefore starts and ends with :func:`clock`, which first waits for the device to finish what
is queued (``torch.cuda.synchronize(device)`` on a CUDA device; nothing on the CPU, whose work is synchronous).
Users: the verification cost curve (``core/verify_cost.py``: CAPE's trim, PLD+'s adaptive ``K``), the PCT
``StepTimer``'s ``s_d`` / ``s_t`` (``edd/tree_proposer.py``), the drafter cost c (``core/drafter_cost.py``: the
bench and draft-vocab), and the reported statistics: the decoding loops' draft / verify / total times
(``core/tree_decoding.py``, ``space/decoding.py``, the GLIDE / EDD chain generators) and the bench's timed
generations and ``ForwardMeter``.

A sync stalls the loop, so a decoding loop times nothing its caller did not ask for: with no statistics it ticks
:func:`untimed` instead of :func:`clock`. A measurement the algorithm itself needs while decoding (the paper's PCT
``s_d`` / ``s_t``) uses :class:`DeviceTimer`, which never waits: CUDA events, read once the device has passed them.
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


def on_cuda(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA device: the one check behind :func:`synchronize` and :class:`DeviceTimer`."""
    return torch.device(device).type == "cuda"


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has finished its queued work (CUDA only; a no-op elsewhere)."""
    device = torch.device(device)
    if on_cuda(device):
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


class DeviceTimer:
    """Seconds of device work between two marks, without ever waiting for the device.

    ``mark()`` notes a point in the work queued so far; ``elapsed(start, end)`` is the time between two marks, or
    ``None`` while the device has not reached ``end`` yet (keep the pair and ask again later). On CUDA a mark is a
    ``torch.cuda.Event(enable_timing=True)`` recorded on the device's current stream and the time is read with
    ``Event.query()`` first, which does not block, so a timed region costs no sync; elsewhere a mark is
    ``time.perf_counter()`` (CPU work is synchronous) and the time is there at once."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.events = on_cuda(self.device)

    def mark(self) -> float | torch.cuda.Event:
        if not self.events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def elapsed(self, start: float | torch.cuda.Event, end: float | torch.cuda.Event) -> float | None:
        if not self.events:
            return end - start
        if not end.query():  # marks on one stream complete in order: start has too once end has
            return None
        return start.elapsed_time(end) / 1000.0


def median(samples: list[float]) -> float:
    """The middle of ``samples`` (the upper one of an even count): what a cost takes of its timed samples."""
    return sorted(samples)[len(samples) // 2]
