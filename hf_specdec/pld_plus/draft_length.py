"""How many tokens PLD+ drafts per step (PLD+, arXiv:2412.01447, §4.3's K): fixed, or adaptive to the verification cost."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.verify_cost import CostCurve
from .defaults import DEFAULT_PRIORS


@dataclass
class DraftLength:
    """``K`` per step (§4.3's K, chosen by expected time gain: an extension for CPUs, where drafted tokens cost).

    Fixed mode (``cost=None``): always ``max_k`` tokens, the paper's fixed ``K``.

    Adaptive mode: a copied draft is either wrong from its first token or right for a while, so acceptance is
    modelled in two parts: the first token is accepted with probability ``h`` (the *hit* rate), each later one, once
    the tokens before it were, with probability ``a`` (the *continuation* rate). A ``K``-token draft then yields
    ``E(K) = 1 + h (1 - a^K) / (1 - a)`` tokens (the target's own token included) for a forward costing ``c(K + 1)``
    one-token forwards (:class:`~hf_specdec.core.verify_cost.CostCurve`, measured on the running machine). The step
    drafts the ``K <= max_k`` maximising ``E(K) / c(K + 1)``, and nothing when no ``K`` beats a plain step
    (``E / c <= 1``). ``h`` is estimated online separately for a *fresh* occurrence and for a *running copy* (the
    best occurrence is exactly where the previous, fully accepted draft's copy continues), ``a`` over all drafts;
    each estimate starts from a prior worth ``weight`` observations. Priors come from the summarize tuning
    (``hf-specdec pld-tune``). A single geometric rate for all tokens (this class's first version) under-drafts the
    long, correct copies of edit tasks (docs/pld-plus.md, "Draft length").
    """

    max_k: int
    cost: CostCurve | None = None
    prior_fresh: float = DEFAULT_PRIORS[0]
    prior_run: float = DEFAULT_PRIORS[1]
    prior_continue: float = DEFAULT_PRIORS[2]
    weight: float = 8.0
    _continue_at: int | None = None
    # [successes, failures] of first tokens (fresh / run) and of later tokens ("continue")
    _counts: dict = field(default_factory=lambda: {"fresh": [0, 0], "run": [0, 0], "continue": [0, 0]})
    _last: str = "fresh"

    def acceptance(self, kind: str) -> float:
        """The current estimate of ``h`` (``kind`` ``"fresh"`` or ``"run"``) or of ``a`` (``"continue"``)."""
        good, bad = self._counts[kind]
        prior = {"fresh": self.prior_fresh, "run": self.prior_run, "continue": self.prior_continue}[kind]
        return (good + self.weight * prior) / (good + bad + self.weight)

    def for_source(self, j: int, budget: int | None = None) -> int:
        """Tokens to draft from occurrence ``j`` (``0``: do not draft); ``budget`` caps it."""
        cap = self.max_k if budget is None else min(self.max_k, budget)
        self._last = "run" if j == self._continue_at else "fresh"
        if self.cost is None or cap < 1:
            return max(cap, 0)
        if self.cost.needs_plain():  # a plain step: the learnt c(q) asks for a t(1) sample
            return 0
        h, a = self.acceptance(self._last), min(self.acceptance("continue"), 0.999)
        best_k, best_gain, expected, term = 0, 1.0, 1.0, h
        for k in range(1, cap + 1):
            expected += term  # + P(the k-th drafted token is accepted) = h a^(k-1)
            term *= a
            gain = expected / self.cost(k + 1)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def expected(self, k: int) -> float:
        """``E(k)``: the tokens a ``k``-token draft from the last :meth:`for_source` occurrence yields (its bonus
        token included)."""
        h, a = self.acceptance(self._last), min(self.acceptance("continue"), 0.999)
        return 1.0 + h * (1.0 - a**k) / (1.0 - a)

    def observe(self, kind: str, hit: bool) -> None:
        """A first token the cost rule did not draft, scored against the token the target then emitted (a free
        observation of ``h``; the target's token equals the copied one exactly when a one-token draft of it would
        have been accepted, and under sampling as often as it would be). Without it a hit rate that sank early
        (a few unlucky drafts where verification is dear) could never rise again: no draft, no evidence."""
        self._counts[kind][0 if hit else 1] += 1

    def update(self, source_start: int | None, drafted: int, accepted: int) -> None:
        """After verification: ``accepted`` of the ``drafted`` tokens copied from ``source_start`` were kept."""
        if source_start is None or drafted == 0:
            self._continue_at = None
            return
        self._counts[self._last][0 if accepted else 1] += 1
        if accepted:
            cont = self._counts["continue"]
            cont[0] += accepted - 1
            cont[1] += int(accepted < drafted)
        self._continue_at = source_start + accepted if accepted >= drafted else None
