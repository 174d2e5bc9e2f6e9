"""Drafts sized by their cost: a draft token is kept only if it pays for the time it adds.

Time of one step, in one-token target forwards: ``T = c(q) + k * c_d``, with ``q = 1 + n`` the tokens the target
verifies (the root and ``n`` drafted nodes; ``c(q)``: the learnt verification cost curve,
``core/verify_cost.py``, ``c(1) = 1``) and ``k`` drafter forwards of cost ``c_d`` each (``core/drafter_cost.py``;
EDD (ACL 2025)'s s_d/s_t). Tokens it yields: ``E = 1 + sum_i e_i``, where ``e_i`` is node ``i``'s probability of being
accepted, estimated by the drafter as the product of the confidences along its path (CAPE's ``P(reach i) * p``,
PCT's estimate). Decoding runs at ``E / T`` tokens per forward; plain ``generate`` at 1.

**Which nodes.** Adding node ``i`` to a tree of ``n`` nodes adds ``e_i`` to ``E`` and ``c(q + 1) - c(q)`` to ``T``;
it raises ``E / T`` exactly when ``e_i / (c(q + 1) - c(q)) >= E / T``. :meth:`DraftBudget.keep` orders the nodes
best estimate first (a node's estimate is never above its parent's, so every prefix is a tree) and keeps the prefix
with the highest ``E / T``: while ``c(q)`` is convex, the nodes added while that holds. In a batch of ``rows`` rows,
a wider forward slows every row: the marginal cost counts ``rows`` times.

**Whether to run the drafter again.** Drafting one level deeper costs ``c_d`` now, before its confidences are
known; the best it can add is ``reach``, the estimate of the node it would extend. :meth:`DraftBudget.worth_drafting`
runs it only when ``reach >= c_d + c(q + 1) - c(q)`` (a falling ``c`` counted as flat, :meth:`DraftBudget.expand_threshold`):
never a forward that could not pay for itself. The first
drafter forward of a step always runs (its confidence decides everything), so with a drafter too weak for the
machine a step costs one target forward plus one drafter forward: about ``1 + c_d`` of ``generate``'s.

Where verifying is nearly free (a GPU: ``c(q)`` flat) and the drafter cheap, this keeps whole trees, as the papers'
rules do; on a CPU in fp32, where ``c(q)`` rises steeply, it keeps short ones.

**Checked against what is accepted.** The rule is only as good as the estimates ``e_i``. :class:`DraftGate` closes
the loop: it scales the estimates by the running ratio of accepted tokens to estimated ones, and it stops the
drafting itself (the first drafter forward included) while the drafted steps have yielded fewer tokens than their
modelled cost ``T`` (``E / T < 1`` as measured, not as estimated), with probes at growing gaps. A method whose drafts
do not pay on the machine then costs about what ``generate`` costs, plus ``c_d / 32`` per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..kernels import kernels_of
from .cost_store import entry_key, lookup, store
from .verify_cost import CostCurve, setting_key, setting_label

_ATTR = "_hf_specdec_drafter_cost"
_GATES = "_hf_specdec_draft_gates"


class DraftBudget:
    """The cost model of the module docstring: ``cost`` (``c(q)``), ``drafter_cost`` (``c_d``) and ``rows``."""

    def __init__(self, cost: CostCurve | Callable[[int], float], drafter_cost: float = 0.0, rows: int = 1):
        self.cost, self.drafter_cost, self.rows = cost, float(drafter_cost), int(rows)

    def draft_now(self, gate: DraftGate | None) -> bool:
        """Draft this step? Not while the learnt cost curve asks for a plain step (``verify_cost.LearnedCurve``: a
        ``t(1)`` sample); else ``gate``'s answer (always, without one)."""
        needs_plain = getattr(self.cost, "needs_plain", None)
        if needs_plain is not None and needs_plain():
            return False
        return gate is None or gate.draft_now()

    def marginal(self, n: int) -> float:
        """The time one more verified node adds to a tree of ``n`` nodes (``q = 1 + n``), for every row."""
        return self.rows * (self.cost(n + 2) - self.cost(n + 1))

    def expand_threshold(self, n: int) -> float:
        """The least estimate of a node worth a drafter forward to extend, in a tree of ``n`` nodes: ``c_d`` plus the
        marginal verification cost, which counts as 0 where the measured ``c(q)`` falls (fp32 on a CPU: ``c(3)``
        above ``c(4)``; bf16: ``c(3)`` below ``c(2)`` by more than ``c_d``): a falling cost is no reason to draft a
        node, and a negative threshold would have a tree expand every node."""
        return self.drafter_cost + max(self.marginal(n), 0.0)

    def worth_drafting(self, reach: float, n: int) -> bool:
        """Run one more drafter forward to extend a node of estimate ``reach`` in a tree of ``n`` nodes?"""
        return reach >= self.expand_threshold(n)

    def step_time(self, n: int, forwards: int) -> float:
        """``T`` of a step verifying ``n`` nodes drafted with ``forwards`` drafter forwards."""
        return 1.0 + forwards * self.drafter_cost + self.rows * (self.cost(n + 1) - self.cost(1))

    def keep(self, estimates: Sequence[float], depths: Sequence[int], forwards: int = 1) -> list[int]:
        """The nodes worth verifying (increasing indices): the prefix of the best-first order (shallower, then
        earlier, on ties) with the highest ``E / T`` (the longest on ties); ``forwards``: drafter forwards spent on
        this tree. Where ``c(q)`` is convex this is adding nodes while ``e / (c(q + 1) - c(q)) >= E / T``; a measured
        curve need not be (fp32 on a CPU: ``c(2)``, ``c(3)`` above ``c(4)``), and then a tree of four can pay where
        one node alone would not."""
        order = sorted(range(len(estimates)), key=lambda i: (-estimates[i], depths[i], i))
        gain, time = 1.0, 1.0 + forwards * self.drafter_cost
        best, size = gain / time, 0
        for n, i in enumerate(order):
            gain, time = gain + estimates[i], time + self.marginal(n)
            if gain >= best * time:
                best, size = gain / time, n + 1
        return sorted(order[:size])

    def keep_checked(
        self,
        gate: DraftGate | None,
        estimates: Sequence[float],
        depths: Sequence[int],
        forwards: int,
        first: int | None,
    ) -> tuple[list[int], tuple[float, float, int | None] | None]:
        """:meth:`keep` on the estimates scaled by ``gate`` (capped at 1), and the record of the step that
        :meth:`DraftGate.verified` takes after its verification (``None`` without a gate): the kept nodes' raw
        estimates summed and ``T``, or, when no node is kept, node 0's estimate and ``first``, the drafter's top token
        at the root (scored for free)."""
        if gate is None:
            return self.keep(estimates, depths, forwards), None
        kept = self.keep([min(e * gate.estimate_scale, 1.0) for e in estimates], depths, forwards)
        time = self.step_time(len(kept), forwards)
        if kept or first is None:
            return kept, (sum(estimates[i] for i in kept), time, None)
        return kept, (estimates[0], time, first)


def measured_drafter_cost(drafter, target) -> float:
    """``c_d`` of ``drafter`` on ``target`` on this machine: what the cost store holds for this dtype, device,
    threads and kernels (written by :func:`set_drafter_cost`: ``hf-specdec bench`` times it), else
    :func:`drafter_cost_prior`, so no forward is spent on it during ``generate``. Kept on the drafter."""
    key = _drafter_key(drafter, target)
    cache = drafter.__dict__.setdefault(_ATTR, {})
    if key not in cache:
        c = lookup(entry_key("drafter", [drafter, target], key))
        cache[key] = c if isinstance(c, float) else drafter_cost_prior(drafter, target)
    return cache[key]


def set_drafter_cost(drafter, target, c: float) -> None:
    """Use ``c`` (timed by ``drafter_cost.drafter_cost``) as ``c_d`` from now on, in this process and later ones."""
    key = _drafter_key(drafter, target)
    drafter.__dict__.setdefault(_ATTR, {})[key] = float(c)
    store(entry_key("drafter", [drafter, target], key), float(c))


# c_d over the byte ratio: a drafter step reads fewer bytes than its share of a target step's time (SmolLM2-135M,
# fp32, AMD Zen 5, 2 threads: GLIDE 0.072 timed against 0.066 by bytes, EDD 0.097 against 0.061)
PRIOR_OVERHEAD = 1.25


def drafter_cost_prior(drafter, target) -> float:
    """``c_d`` before it is timed: decoding one token reads every weight once, so a drafter step (its own layers and
    the head rows it scores) costs about its bytes over a target step's (an embedding table is not read: one row
    is), times :data:`PRIOR_OVERHEAD`. Packed layers (``hf_specdec.kernels``) count as the weight they pack."""
    head = target.get_output_embeddings()
    ids = getattr(drafter, "draft_vocab_ids", None)
    rows = head.out_features if ids is None else len(ids)
    itemsize = torch.empty((), dtype=target.dtype, device="cpu").element_size()
    return PRIOR_OVERHEAD * (step_bytes(drafter) + rows * head.in_features * itemsize) / step_bytes(target)


def step_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s weights a one-token step reads: every linear layer's weight (packed or not, a tied LM
    head included) and every other parameter once, but not an embedding table."""
    from ..kernels import PackedLinear

    seen, total = set(), 0
    for m in model.modules():
        if isinstance(m, PackedLinear):
            itemsize = torch.empty((), dtype=m.packed.dtype, device="cpu").element_size()
            total += m.in_features * m.out_features * itemsize
            params = [] if m.bias is None else [m.bias]
        elif isinstance(m, torch.nn.Embedding):
            params = []
        else:
            params = list(m.parameters(recurse=False))
        for p in params:
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
    return total


def _drafter_key(drafter, target) -> tuple:
    key = setting_key(target)
    if kernels_of(drafter) != key[3]:  # the drafter's own layers on other kernels than the target's
        key = (*key[:3], f"target {key[3]}, drafter {kernels_of(drafter)}")
    return key


def cached_drafter_costs(drafter) -> dict[str, float]:
    """The ``c_d`` values :func:`measured_drafter_cost` has timed for ``drafter`` in this process, by
    ``verify_cost.setting_label``."""
    return {setting_label(key): c for key, c in drafter.__dict__.get(_ATTR, {}).items()}


class DraftGate:
    """The cost rule checked against what verification accepts, one per generation.

    The rule above trusts the drafter's estimates. A drafter that is more confident than it is right drafts trees
    that do not pay, and even a drafter whose trees are cut to nothing still costs its first forward every step. So
    the loop feeds back what happened:

    - **calibration**: ``scale`` is the running ratio of accepted tokens to the estimates' sum over the verified
      nodes (expected accepted length = sum of the nodes' acceptance probabilities), by which the proposer multiplies
      its estimates before applying the rule (at most :attr:`MAX_SCALE`, estimates capped at 1);
    - **the gate**: ``rate`` is the running ratio of tokens emitted to the step's modelled cost ``T`` over the steps
      that drafted: the speed of drafting relative to plain decoding (1 token per forward). While it is >= 1 every
      step drafts; below, drafting pays less than ``generate`` and only probes run, 1, 2, 4 ... up to ``max_gap``
      steps apart, so the drafter's cost falls to ``c_d / max_gap`` per step while a text on which it would pay
      (a copy, code) is still noticed. A probe is sized on the drafter's own estimates (:attr:`estimate_scale`):
      sized by a ``scale`` that has fallen, its tree would be cut to nothing, emit one token at a cost above one
      forward, and so could never show that drafting pays again.

    Both running means start from a prior, one step on which the estimates were right and drafting broke even, so a
    first rejected draft does not set ``scale`` to 0. They average over about 20 steps (``momentum`` 0.95): a step's
    yield is noisy (0 to ``gamma`` accepted tokens), and averaged over about 7 steps (momentum 0.85) a drafter worth
    1.25x would close the gate on about 28% of its steps by chance (a seeded simulation, ``test_draft_gate.py``),
    running them at 1x; over 20, 4%. A regime where drafting does not pay still closes it at once, since the prior
    sits at break-even. A probe, which stands for the steps since the last one, weighs 0.15, so a closed gate reopens
    after a probe or two that pay.

    Nothing here reads the device: the proposer passes what the loop already read (:meth:`outcome`, once per
    drafted step). The decisions depend on tokens already emitted only, so sampling stays exact (a proposal may
    depend on the prefix in any way). With the measured costs the gate is kept on the drafter across generations
    (:func:`shared_gate`): what was learnt on one prompt is where the next one starts."""

    MAX_SCALE = 1.5
    PROBE_WEIGHT = 0.15  # of a probe's outcome (an open gate's step weighs 1 - momentum = 0.05)

    def __init__(self, momentum: float = 0.95, max_gap: int = 32):
        self.momentum, self.max_gap = momentum, int(max_gap)
        self.predicted = self.accepted = 1.0  # running means behind ``scale``, from the prior
        self.tokens: float | None = None  # running means behind ``rate`` (None: no drafted step yet)
        self.time = 0.0
        self.gap, self.wait = 1, 0
        self.probing = False  # is this step a probe of a closed gate?

    @property
    def scale(self) -> float:
        if not self.predicted:
            return 1.0
        return min(self.accepted / self.predicted, self.MAX_SCALE)

    @property
    def estimate_scale(self) -> float:
        """What the proposer multiplies its estimates by this step: ``scale``, but at least 1 on a probe."""
        return max(self.scale, 1.0) if self.probing else self.scale

    @property
    def rate(self) -> float | None:
        return None if self.tokens is None else self.tokens / max(self.time, 1e-9)

    def draft_now(self) -> bool:
        """Draft this step? Always while drafting pays (or nothing is known yet); else every ``gap``-th step."""
        rate = self.rate
        self.probing = False
        if rate is None or rate >= 1.0:
            self.gap, self.wait = 1, 0
            return True
        self.wait += 1
        if self.wait < self.gap:
            return False
        self.wait, self.gap, self.probing = 0, min(2 * self.gap, self.max_gap), True
        return True

    def verified(self, step: tuple[float, float, int | None], new_tokens: list[int], accepted: int) -> None:
        """The outcome of a drafted step ``(predicted, T, first)`` whose verification emitted ``new_tokens``, the
        first ``accepted`` of them drafted. When the rule kept no node, ``first`` is the drafter's top token at the
        root and ``predicted`` its confidence: it is scored for free against the token the target emitted there (under
        greedy, exactly its acceptance), so the scale keeps learning while nothing is verified and a drafter that
        turns good is noticed."""
        predicted, time, first = step
        hit = accepted if first is None else float(bool(new_tokens) and new_tokens[0] == first)
        self.outcome(predicted, hit, 1.0 + accepted, time)

    def outcome(
        self, predicted: float, accepted: float, tokens: float, time: float, probe: bool | None = None
    ) -> None:
        """One drafted step: ``predicted`` (the sum of its verified nodes' raw estimates) against ``accepted`` feeds
        ``scale``; ``tokens`` emitted per ``time`` (its modelled cost ``T``) feeds ``rate``. ``probe``: was that step
        a probe of the closed gate (default: is the current one, :meth:`draft_now`'s flag)? A probe stands for the
        steps since the last one, so it weighs :attr:`PROBE_WEIGHT`, not ``1 - momentum``."""
        if self.tokens is None:  # the prior: one step that broke even
            self.tokens = self.time = 1.0
        probe = self.probing if probe is None else probe
        m = 1.0 - self.PROBE_WEIGHT if probe else self.momentum
        self.predicted = m * self.predicted + (1 - m) * predicted
        self.accepted = m * self.accepted + (1 - m) * accepted
        self.tokens = m * self.tokens + (1 - m) * tokens
        self.time = m * self.time + (1 - m) * time


def shared_gate(owner, target) -> DraftGate:
    """The :class:`DraftGate` kept on ``owner`` (a drafter, or SPACE's model) for ``target``'s dtype, device and
    thread count, as its measured costs are: one per machine setting, carried from one generation to the next. In a
    batch every row's proposer shares it (their outcomes pool; a probe comes ``rows`` times as often)."""
    key = setting_key(target)
    return owner.__dict__.setdefault(_GATES, {}).setdefault(key, DraftGate())
