"""What a verification forward costs on the running machine, by the number of query tokens it verifies.

Speculative decoding pays off when a forward over ``q`` tokens (the last token plus ``q - 1`` drafted ones)
yields more tokens than it costs, in units of a plain one-token forward. That cost curve ``c(q) = t(q) / t(1)``
depends on the model, its dtype, its kernels (``hf_specdec.kernels``), the hardware, the thread count and the
context length.

It is learnt while decoding, from the decoding's own forwards (:class:`LearnedCurve`): each verification forward
the loop runs anyway is a sample of ``t(q)`` for its ``q``, so no forward is spent on measuring and a process's first
``generate`` call runs at full speed. Until a size has been seen, ``c(q)`` is the prior: the curve an earlier
process learnt on the same machine (``cost_store.py``), else :data:`PRIOR`. One curve is kept per (model, dtype,
device, threads, kernels, context length, batch) on the model object, so later calls go on from what earlier ones
learnt. :func:`timed_cost` times a curve directly, for a tool that sizes something once (``draft-vocab``).
"""

from __future__ import annotations

from collections import deque

import torch

from ..hf_compat import CACHE_ARGUMENT
from ..kernels import kernels_of
from .cost_store import entry_key, lookup, store
from .timing import DeviceTimer, device_of, median, seconds

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
    model(context[None].repeat(batch, 1), **{CACHE_ARGUMENT: cache}, logits_to_keep=1)

    def step(q: int) -> None:
        x = context[-q:][None] if q <= context.shape[0] else context[None, :1].repeat(1, q)
        model(x.repeat(batch, 1), **{CACHE_ARGUMENT: cache}, logits_to_keep=q)
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

    def needs_plain(self) -> bool:
        """Whether this step should verify the last token alone (a :class:`LearnedCurve` asking for a ``t(1)``)."""
        return False

    @classmethod
    def linear(cls, slope: float) -> CostCurve:
        """``c(q) = 1 + slope * (q - 1)`` (tests, or a user who measured their own)."""
        return cls({1: 1.0, 2: 1.0 + slope})

    def __repr__(self) -> str:
        return "CostCurve(" + ", ".join(f"c({q})={c:.2f}" for q, c in sorted(self.relative.items())) + ")"


# c(q) before any sample, on a machine where nothing was learnt yet: about what oneDNN kernels give in fp32 and
# native bf16 on the CPUs measured (AMD Zen 4 / 5, 2 threads, after 64 tokens: c(2) 1.10-1.16, c(4) 0.98-1.08,
# c(16) 1.07-1.38), so a drafter proposes from its first step and the sizes it proposes are then measured
PRIOR = {1: 1.0, 2: 1.12, 4: 1.15, 8: 1.25, 16: 1.5, 64: 3.0}


class LearnedCurve(CostCurve):
    """A :class:`CostCurve` learnt from the decoding's own verification forwards.

    :meth:`observe` takes the seconds of a forward over ``q`` tokens; ``t(q)`` is the fastest of the last
    :data:`WINDOW` samples of that size, ``t(1)`` included, and ``c(q) = t(q) / t(1)`` for every size seen at least
    twice. The same window for every size: the fastest of more samples is faster, so a ``t(q)`` taken over more of
    them than ``t(1)`` would make drafting look cheaper than it is. The fastest,
    not the median: what else runs on the machine only ever slows a forward down, and a step of a size seen a few
    times is as likely as not to have been slowed (a first step after the prefill is, by a third on the CPU). Other
    sizes are interpolated between the sizes seen, and beyond them follow ``prior``'s shape. A ``t(1)`` sample comes
    from a step that drafts nothing: :meth:`needs_plain` asks for one (the proposers then skip that step's draft)
    while fewer than :data:`BASE_SAMPLES` are known, and again when the newest is :data:`REFRESH` samples old, so
    both sides of a ratio are recent. A curve that no
    loop feeds (asked :data:`UNANSWERED` times in a row with nothing observed) stops asking and stays at its prior.
    At the end of a generation the curve is written to the cost store (:meth:`save`) for later processes."""

    WINDOW = 4  # samples kept per size: the recent ones, so that t(q) / t(1) compares nearby moments
    BASE_SAMPLES = 2
    REFRESH = 32
    UNANSWERED = 8  # plain steps asked for with no forward observed: nothing feeds this curve, stop asking

    def __init__(self, prior: dict[int, float], stored_key: str | None = None):
        super().__init__(prior)
        self.prior = dict(self.relative)
        self.samples: dict[int, deque] = {}
        self.seen = 0  # observations so far
        self.base_seen = -(10**9)  # ``seen`` at the newest t(1) sample
        self.asked = 0  # plain steps asked for since the last observation
        self.warm: set[int] = set()  # sizes whose warm-up forward has been seen
        self.stored_key = stored_key

    def needs_plain(self) -> bool:
        base = self.samples.get(1, ())
        wanted = len(base) < self.BASE_SAMPLES or self.seen - self.base_seen > self.REFRESH
        if wanted and self.asked < self.UNANSWERED:
            self.asked += 1
            return True
        return False

    def observe(self, q: int, seconds: float) -> None:
        """One verification forward over ``q`` tokens took ``seconds``. The first of a size is a warm-up, not a
        sample: a process's first forward of a new size also builds its kernels (oneDNN's, one per row count)."""
        self.asked = 0
        if q not in self.warm:
            self.warm.add(q)
            return
        self.samples.setdefault(q, deque(maxlen=self.WINDOW)).append(seconds)
        self.seen += 1
        if q == 1:
            self.base_seen = self.seen
        if len(self.samples.get(1, ())) >= self.BASE_SAMPLES:
            self.relative = self._learnt()
            self._memo.clear()

    def _learnt(self) -> dict[int, float]:
        base = min(self.samples[1])
        seen = {q: max(min(s) / base, 1.0) for q, s in self.samples.items() if len(s) >= 2 or q == 1}
        top = max(seen)
        beyond = {q: seen[top] * c / interpolate(self.prior, top) for q, c in self.prior.items() if q > top}
        return dict(sorted({**seen, **beyond}.items()))

    def save(self) -> None:
        """Write what was learnt to the cost store (nothing before ``t(1)`` and one other size are known)."""
        learnt = any(q != 1 and len(s) >= 2 for q, s in self.samples.items())
        if self.stored_key is not None and learnt and len(self.samples.get(1, ())) >= self.BASE_SAMPLES:
            store(self.stored_key, {str(q): c for q, c in self.relative.items()})


def measured_cost(model, context: torch.Tensor, batch: int = 1, variant: str = "") -> LearnedCurve:
    """The model's :class:`LearnedCurve` on this machine after ``context`` (the prompt's ids; its length picks the
    :func:`context_bucket`) for a batch of ``batch`` rows: the one kept on the model for this setting, else a new
    one whose prior is what the cost store holds for it (or :data:`PRIOR`). No forward runs here; the decoding loops
    feed it (:class:`CostObserver`). ``variant``: a curve of its own for forwards that cost more than the model's
    (PLD+(a)'s, which also compute the induction heads' attention weights)."""
    key = curve_key(model, context.shape[-1], batch, variant)
    cache = model.__dict__.setdefault(_ATTR, {})
    if key not in cache:
        stored = entry_key("verify", [model], (*key, "learnt"))
        prior = lookup(stored)
        prior = {int(q): float(c) for q, c in prior.items()} if isinstance(prior, dict) and prior else PRIOR
        cache[key] = LearnedCurve(prior, stored)
    return cache[key]


def curve_key(model, context_length: int, batch: int = 1, variant: str = "") -> tuple:
    """What a curve of ``model`` is kept by: :func:`setting_key`, the context bucket, the batch and a variant."""
    bucket = context_bucket(context_length)
    return (
        setting_key(model)
        + ((f"context {bucket}",) if bucket > CONTEXTS[0] else ())
        + ((batch,) if batch > 1 else ())
        + ((variant,) if variant else ())
    )


class CostObserver:
    """Feeds a decoding loop's verification forwards to the model's :class:`LearnedCurve` for this generation.

    ``start()`` before the forward, ``stop(q, mark)`` after it. Marks are :class:`~.timing.DeviceTimer` marks: on a
    CUDA device, events read once the device has passed them (a pair not done yet is read on a later step), so
    nothing waits; on the CPU, the clock. ``finish()`` stores the curve. Without a curve for this setting (no method
    asked for one), it does nothing."""

    def __init__(self, model, context_length: int, batch: int = 1, variant: str = ""):
        self.batch = batch  # forwards of this many rows are samples (a batch whose rows have left is not)
        self.curve = model.__dict__.get(_ATTR, {}).get(curve_key(model, context_length, batch, variant))
        self.timer = DeviceTimer(device_of(model)) if self.curve is not None else None
        self.pending: list[tuple] = []

    def start(self):
        return None if self.timer is None else self.timer.mark()

    def stop(self, q: int, start) -> None:
        if self.timer is None:
            return
        self.pending.append((q, start, self.timer.mark()))
        still = []
        for q, a, b in self.pending:
            elapsed = self.timer.elapsed(a, b)
            if elapsed is None:
                still.append((q, a, b))
            else:
                self.curve.observe(q, elapsed)
        self.pending = still

    def finish(self) -> None:
        if self.curve is not None:
            self.curve.save()


def timed_cost(model, context: torch.Tensor, repeats: int = 5, batch: int = 1) -> CostCurve:
    """A :class:`CostCurve` timed now with :func:`forward_times` after the last :func:`context_bucket` tokens of
    ``context`` (``repeats`` interleaved samples of every size in :data:`SIZES`): what a report or a tool that
    sizes something once (``draft-vocab``) uses, not the decoding loops."""
    bucket = context_bucket(context.shape[-1])
    return CostCurve(forward_times(model, context[-bucket:], SIZES, repeats, batch))


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
