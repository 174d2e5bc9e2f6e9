"""Per-generation speculative-decoding statistics, shared by every decoding loop and the bench.

Names used throughout the project (Spec-Bench / the papers):

- tau: mean number of tokens produced per target forward, counting the bonus token
  (``new_tokens / target_forwards``; plain decoding has tau = 1).
- alpha: acceptance rate, ``accepted draft tokens / drafted tokens`` (tree methods count every
  verified node as drafted, so a tree's alpha is lower than a chain's at equal tau).
- draft / verify share: fraction of wall time spent drafting and in target (verification) forwards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .timing import clock, device_of, median


@dataclass
class DecodeStats:
    new_tokens: int = 0
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0
    batched_forwards: int = (
        0  # the tree core's forwards (a batched one counts once); target_forwards counts row-forwards
    )
    # the per-step split (filled by the bench's meters, bench/methods.run_row): seconds inside target forwards and
    # inside drafter forwards; the rest of total_time is overhead. forwards: target forward calls (a batched forward
    # counts once); one_token_forward: median seconds of this run's one-token target forwards (None if it had none)
    target_time: float = 0.0
    drafter_time: float = 0.0
    forwards: int = 0
    one_token_forward: float | None = None
    host_syncs: int | None = None  # device-to-host reads outside forwards (core/host_syncs.py), when counted
    steps: list[dict] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("steps")
        d.update(tau=self.tau, alpha=self.alpha)
        return d


class ForwardMeter:
    """Counts and times a module's forward calls through hooks (no change to the module).

    Used on the target to get the number of target forwards, their wall time, their rows and query lengths
    (a verification forward over ``1 + n`` tokens checked ``n`` drafted tokens), and on a drafter
    module to get draft time. Use as a context manager.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.calls = 0
        self.time = 0.0
        self.query_lengths: list[int] = []
        self.batch_sizes: list[int] = []  # rows of each forward
        self.times: list[float] = []  # seconds of each forward
        self.syncs = None  # a HostSyncCounter paused inside the forwards (core/host_syncs.py), if counting
        self._t0 = 0.0
        self._handles: list = []
        self.device = device_of(module)  # timed regions wait for it (core/timing.py)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        self.query_lengths.append(int(ids.shape[1]) if ids is not None else 0)
        self.batch_sizes.append(int(ids.shape[0]) if ids is not None else 0)
        if self.syncs is not None:
            self.syncs.pause()
        self._t0 = clock(self.device)

    def _post(self, module, args, kwargs, output):
        dt = clock(self.device) - self._t0
        if self.syncs is not None:
            self.syncs.resume()
        self.calls += 1
        self.time += dt
        self.times.append(dt)

    def one_token_forward(self) -> float | None:
        """Median seconds of the one-token forwards (plain decoding steps) seen, ``None`` if there were none."""
        times = [t for t, q in zip(self.times, self.query_lengths) if q == 1]
        return median(times) if times else None

    def __enter__(self) -> ForwardMeter:
        self._handles = [
            self.module.register_forward_pre_hook(self._pre, with_kwargs=True),
            self.module.register_forward_hook(self._post, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def split(self, stats: DecodeStats, drafter: DrafterMeter | None) -> DecodeStats:
        """Fill ``stats``' per-step split from this meter (the target) and ``drafter``'s."""
        stats.target_time, stats.forwards = self.time, self.calls
        stats.drafter_time = drafter.time if drafter is not None else 0.0
        stats.one_token_forward = self.one_token_forward()
        return stats

    def chain_stats(
        self, prompt_len: int, new_tokens: int, total_time: float, draft_time: float | None = None
    ) -> DecodeStats:
        """Stats of a draft-then-verify chain loop inferred from the target's forwards.

        The first forward covers the prompt (a loop may also append the first drafts to it), every later one the last token plus the drafts: so forward i checked ``query_length - 1`` drafted tokens
        (``query_length - prompt_len`` for the first), and each forward produced one token of its own,
        hence ``accepted = new_tokens - forwards``.
        """
        lengths = self.query_lengths or [prompt_len]
        drafted = max(lengths[0] - prompt_len, 0) + sum(max(q - 1, 0) for q in lengths[1:])
        accepted = max(new_tokens - self.calls, 0)
        return DecodeStats(
            new_tokens=new_tokens,
            target_forwards=self.calls,
            drafted=drafted,
            accepted=min(accepted, drafted),
            verify_time=self.time,
            draft_time=(total_time - self.time) if draft_time is None else draft_time,
            total_time=total_time,
        )


class DrafterMeter:
    """Times a drafter's forwards: the calls of its forward methods (``hidden_states`` / ``decode`` / ``draft_logits``,
    whichever it has; ``modeling/``), wrapped on the instance for the duration of the block. Nested calls count once.
    With a ``HostSyncCounter`` as ``syncs``, counting pauses inside them (a forward's internals are the model's)."""

    METHODS = ("hidden_states", "decode", "draft_logits")

    def __init__(self, drafter, syncs=None):
        self.drafter, self.syncs = drafter, syncs
        self.time, self.calls = 0.0, 0
        self.device = device_of(drafter)
        self._depth, self._t0 = 0, 0.0
        self._wrapped: list[str] = []

    def _wrap(self, original):
        meter = self

        def timed(*args, **kwargs):
            if meter._depth == 0:
                if meter.syncs is not None:
                    meter.syncs.pause()
                meter._t0 = clock(meter.device)
            meter._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                meter._depth -= 1
                if meter._depth == 0:
                    meter.time += clock(meter.device) - meter._t0
                    meter.calls += 1
                    if meter.syncs is not None:
                        meter.syncs.resume()

        return timed

    def __enter__(self) -> DrafterMeter:
        for name in self.METHODS:
            if callable(getattr(self.drafter, name, None)):
                setattr(self.drafter, name, self._wrap(getattr(self.drafter, name)))
                self._wrapped.append(name)
        return self

    def __exit__(self, *exc) -> None:
        for name in self._wrapped:
            delattr(self.drafter, name)  # the instance attribute: the class's method shows again
        self._wrapped = []
