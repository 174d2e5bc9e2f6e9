"""What a verification forward costs on the running machine, by the number of query tokens it verifies.

Speculative decoding pays off when a forward over ``q`` tokens (the last token plus ``q - 1`` drafted ones)
yields more tokens than it costs, in units of a plain one-token forward. That cost curve ``c(q) = t(q) / t(1)``
depends on the model, its dtype, its kernels (``hf_specdec.kernels``), the hardware, the thread count and the
context length, so it is measured, with a few timed forwards, once per (model, dtype, device, threads, kernels,
context length) and kept on the model object and on disk (``cost_store.py``), so later ``generate`` calls and
later processes reuse it.
"""

from __future__ import annotations

import torch

from ..kernels import kernels_of
from .cost_store import entry_key, lookup, store
from .timing import device_of, median, seconds

# query lengths timed; c(q) in between is linear interpolation, beyond is extrapolation. 2 and 3 are timed: on a
# CPU in fp32 they can cost more than 4 (AMD Zen 5, 2 threads: c(2) 1.59, c(3) 1.97, c(4) 1.52), which no line
# through 1 and 4 would show, and they are the sizes a weak drafter's trees have
SIZES = (1, 2, 3, 4, 8, 16, 64)
_ATTR = "_hf_specdec_verify_cost"
# context lengths the curve is timed after: a verification forward attends over the whole cache, so at a long
# context a q-token forward costs more one-token forwards than at a short one (SmolLM2-135M, fp32 on oneDNN
# kernels: a 4-6 token step costs ~1.5 one-token forwards after 1,600 tokens and ~1.1 after 64)
CONTEXTS = (64, 256, 1024, 4096)


def context_bucket(length: int) -> int:
    """The longest of :data:`CONTEXTS` that ``length`` tokens reach (the shortest for fewer)."""
    return max((c for c in CONTEXTS if c <= length), default=CONTEXTS[0])


@torch.no_grad()
def forward_times(
    model, context: torch.Tensor, sizes: list[int] | tuple[int, ...], repeats: int = 3, batch: int = 1
) -> dict:
    """Seconds of a cached forward of ``q`` query tokens after the 1-D token ids ``context``, in ``batch``
    identical rows, into the cache the verification loops use (full layers: ``sliding_window.verification_cache``).

    The sizes are timed interleaved: each of ``repeats`` samples times every size back to back, and ``t(q)`` is the
    median ``t(1)`` times the median of the samples' ratios ``t(q) / t(1)`` (the smallest size stands in for 1).
    A CPU's speed drifts from one second to the next; timed back to back, both sides of a ratio see the same
    drift, as in ``drafter_cost.draft_step_costs``. What the loops use is the ratio, ``c(q)``."""
    from .sliding_window import verification_cache

    cache = verification_cache(model, None)
    device = device_of(model)
    context = context.to(device)
    model(context[None].repeat(batch, 1), past_key_values=cache, logits_to_keep=1)

    def step(q: int) -> None:
        x = context[-q:][None] if q <= context.shape[0] else context[None, :1].repeat(1, q)
        model(x.repeat(batch, 1), past_key_values=cache, logits_to_keep=q)
        cache.crop(-q)

    sizes = sorted(sizes)
    samples = [[seconds(lambda q=q: step(q), device) for q in sizes] for _ in range(repeats)]
    base = median([s[0] for s in samples])
    return {q: base * median([s[i] / s[0] for s in samples]) for i, q in enumerate(sizes)}


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
        base = times[min(times)]
        self.relative = {q: max(t / base, 1.0) for q, t in sorted(times.items())}
        self._memo: dict[int, float] = {}  # c(q) by q: a tree's budget asks for the same few sizes per node

    def __call__(self, q: int) -> float:
        c = self._memo.get(q)
        if c is None:
            c = self._memo[q] = max(interpolate(self.relative, q), 1.0)
        return c

    @classmethod
    def linear(cls, slope: float) -> CostCurve:
        """``c(q) = 1 + slope * (q - 1)`` (tests, or a user who measured their own)."""
        return cls({1: 1.0, 2: 1.0 + slope})

    def __repr__(self) -> str:
        return "CostCurve(" + ", ".join(f"c({q})={c:.2f}" for q, c in sorted(self.relative.items())) + ")"


def measured_cost(model, context: torch.Tensor, repeats: int = 5, batch: int = 1) -> CostCurve:
    """The model's :class:`CostCurve` on this machine after ``context`` (the prompt): timed once per model, dtype,
    device, threads, kernels, batch and context length (after the last :func:`context_bucket` tokens of
    ``context``) on a machine (``cost_store.py`` keeps it on disk for later processes), then kept on the model.
    ``batch``: the curve of a batch of that many rows, ``t_B(q) / t_B(1)`` (every row verifying ``q`` tokens).

    ``repeats``: 5 interleaved samples. Five processes each (SmolLM2-135M, fp32, AMD EPYC Zen 1, 2 threads) spread
    c(2), c(3), c(4) over 8%, 21%, 8% of their value with 3 samples, 4%, 5%, 5% with 5 (2%, 3%, 5% with 15); a
    sample there costs ~14 one-token forwards (1.4 s)."""
    bucket = context_bucket(context.shape[-1])
    key = (
        setting_key(model)
        + ((f"context {bucket}",) if bucket > CONTEXTS[0] else ())
        + ((batch,) if batch > 1 else ())
    )
    cache = model.__dict__.setdefault(_ATTR, {})
    if key not in cache:
        stored = entry_key("verify", [model], (*key, f"sizes {SIZES}, {repeats} samples"))
        times = lookup(stored)
        if not isinstance(times, dict):
            times = forward_times(model, context[-bucket:], SIZES, repeats, batch)
            store(stored, {str(q): t for q, t in times.items()})
        cache[key] = CostCurve({int(q): float(t) for q, t in times.items()})
    return cache[key]


def setting_key(model) -> tuple:
    """What a measured cost of ``model`` depends on besides the model: its dtype, device, the thread count and
    the kernels its linear layers run (``hf_specdec.kernels``)."""
    return (str(model.dtype), str(device_of(model)), torch.get_num_threads(), kernels_of(model))


def setting_label(key: tuple) -> str:
    """A cache key of :func:`measured_cost` (or ``draft_budget.measured_drafter_cost``) as text:
    ``"torch.bfloat16, cpu, 2 threads"`` (``", onednn kernels"`` after ``apply_kernels``, ``", batch 4"`` for a
    batch's curve)."""
    dtype, device, threads, kernels, *rest = key
    threads = f"{threads} thread" + ("s" if threads != 1 else "")
    label = f"{dtype}, {device}, {threads}" + (f", {kernels} kernels" if kernels != "stock" else "")
    return label + "".join(f", batch {r}" if isinstance(r, int) else f", {r}" for r in rest)


def cached_curves(model) -> dict[str, CostCurve]:
    """The curves :func:`measured_cost` has measured on ``model`` in this process, by :func:`setting_label`: what
    the cost-sized drafts of every later generation were sized by."""
    return {setting_label(key): curve for key, curve in model.__dict__.get(_ATTR, {}).items()}
