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

from .timing import clock, device_of


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
        0  # batch > 1 (core/batch_decoding.py): forwards; target_forwards counts row-forwards
    )
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
        self._t0 = 0.0
        self._handles: list = []
        self.device = device_of(module)  # timed regions wait for it (core/timing.py)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        self.query_lengths.append(int(ids.shape[1]) if ids is not None else 0)
        self.batch_sizes.append(int(ids.shape[0]) if ids is not None else 0)
        self._t0 = clock(self.device)

    def _post(self, module, args, kwargs, output):
        self.calls += 1
        self.time += clock(self.device) - self._t0

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

    def chain_stats(
        self, prompt_len: int, new_tokens: int, total_time: float, draft_time: float | None = None
    ) -> DecodeStats:
        """Stats of a draft-then-verify chain loop inferred from the target's forwards.

        The first forward covers the prompt (HF's assisted loop also appends the first drafts to it), every
        later one the last token plus the drafts: so forward i checked ``query_length - 1`` drafted tokens
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
