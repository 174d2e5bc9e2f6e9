"""What a verification forward costs on the running machine, by the number of query tokens it verifies.

Speculative decoding pays off when a forward over ``q`` tokens (the last token plus ``q - 1`` drafted ones)
yields more tokens than it costs, in units of a plain one-token forward. That cost curve ``c(q) = t(q) / t(1)``
depends on the model, its dtype, the hardware and the thread count: on this project's 2-core CPU a 11-token
forward costs about 2.3 one-token forwards in fp32 but about 1.25 in bf16, so the best draft length differs by
dtype. The curve is measured once per (model, dtype, device, threads) with a few timed forwards and kept on the
model object, so later ``generate`` calls reuse it.
"""

from __future__ import annotations

import time

import torch

SIZES = (
    1,
    4,
    16,
    64,
)  # query lengths timed; c(q) in between is linear interpolation, beyond is extrapolation
_ATTR = "_hf_specdec_verify_cost"


@torch.no_grad()
def forward_times(model, context: torch.Tensor, sizes: list[int] | tuple[int, ...], repeats: int = 5) -> dict:
    """Seconds of a cached forward of ``q`` query tokens after the 1-D token ids ``context``.

    Rounds over all sizes are interleaved and each size keeps its fastest round: other work on the machine only ever
    adds time, so the minimum is the estimate least disturbed by it (a slow one-token round would otherwise make
    every draft look free)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    context = context.to(device)
    model(context[None], past_key_values=cache, logits_to_keep=1)
    times = {q: float("inf") for q in sizes}
    for _ in range(repeats):
        for q in sizes:
            x = context[-q:][None] if q <= context.shape[0] else context[None, :1].repeat(1, q)
            t0 = time.perf_counter()
            model(x, past_key_values=cache, logits_to_keep=q)
            times[q] = min(times[q], time.perf_counter() - t0)
            cache.crop(-q)
    return times


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators): a forward over more tokens
    never costs less, so a dip in a timed curve is noise."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    return [m for m, w in blocks for _ in range(int(w))]


def interpolate(times: dict[int, float], q: int) -> float:
    """``times`` at ``q``: piecewise linear between the measured sizes, linear extrapolation beyond them."""
    keys = sorted(times)
    if q <= keys[0]:
        return times[keys[0]]
    for a, b in zip(keys, keys[1:]):
        if q <= b:
            return times[a] + (times[b] - times[a]) * (q - a) / (b - a)
    a, b = keys[-2], keys[-1]
    return times[b] + (times[b] - times[a]) * (q - b) / (b - a)


class CostCurve:
    """``c(q)``: the time of a ``q``-token verification forward in one-token forwards (``c(1) = 1``)."""

    def __init__(self, times: dict[int, float]):
        sizes = sorted(times)
        smooth = monotone([times[q] for q in sizes])
        self.relative = {q: max(t / smooth[0], 1.0) for q, t in zip(sizes, smooth)}

    def __call__(self, q: int) -> float:
        return max(interpolate(self.relative, q), 1.0)

    @classmethod
    def linear(cls, slope: float) -> CostCurve:
        """``c(q) = 1 + slope * (q - 1)`` (tests, or a user who measured their own)."""
        return cls({1: 1.0, 2: 1.0 + slope})

    def __repr__(self) -> str:
        return "CostCurve(" + ", ".join(f"c({q})={c:.2f}" for q, c in sorted(self.relative.items())) + ")"


def measured_cost(model, context: torch.Tensor, repeats: int = 5) -> CostCurve:
    """The model's :class:`CostCurve` on this machine (timed once per dtype/device/threads, then cached)."""
    device = next(model.parameters()).device
    key = (str(model.dtype), str(device), torch.get_num_threads())
    cache = model.__dict__.setdefault(_ATTR, {})
    if key not in cache:
        cache[key] = CostCurve(forward_times(model, context[-64:], SIZES, repeats))
    return cache[key]
