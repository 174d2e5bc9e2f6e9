"""The cost rule checked against verification (``core/draft_budget.DraftGate``): drafting stops
when it has not been paying, probes come back at growing gaps, the drafter's estimates are scaled by what was
accepted; on CAPE, PCT and SPACE a draft too dear for the machine is not drafted, and the output does not change."""

from __future__ import annotations

import random

import pytest
import torch

import hf_specdec
from hf_specdec.core.draft_budget import DraftBudget, DraftGate
from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.tree_decoding import tree_generate
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.edd.tree_proposer import EddTreeProposer
from hf_specdec.glide.cape import CapeProposer

from .conftest import tiny_llama
from .test_glide_model import _drafter
from .test_space_decoding import _peaked

pytestmark = pytest.mark.usefixtures("one_thread")


def test_gate_drafts_while_it_pays_and_backs_off_to_probes():
    gate = DraftGate(max_gap=8)
    assert gate.draft_now() and gate.rate is None  # nothing known: draft
    gate.outcome(predicted=1.0, accepted=1.0, tokens=2.0, time=1.5)  # 2 tokens for 1.5 forwards: pays
    assert all(gate.draft_now() for _ in range(10))

    gate = DraftGate(max_gap=8)
    gate.outcome(predicted=0.5, accepted=0.0, tokens=1.0, time=1.5)  # 1 token for 1.5 forwards: loses
    drafted = [i for i in range(60) if gate.draft_now()]
    assert [b - a for a, b in zip(drafted, drafted[1:])] == [
        2,
        4,
        8,
        8,
        8,
        8,
        8,
        8,
    ]  # probes, gaps doubling to 8
    for _ in range(12):  # the probes find a text where drafting pays: every step drafts again
        gate.outcome(predicted=1.0, accepted=2.0, tokens=3.0, time=1.3)
    assert gate.rate > 1 and all(gate.draft_now() for _ in range(10))


def test_gate_scales_estimates_by_what_was_accepted():
    gate = DraftGate()
    assert gate.scale == 1.0  # nothing known: the drafter's own estimates
    for _ in range(100):
        gate.outcome(predicted=2.0, accepted=0.5, tokens=1.5, time=2.0)
    assert gate.scale == pytest.approx(0.25, abs=0.01)  # four times too confident (the prior forgotten)
    for _ in range(60):
        gate.outcome(predicted=0.1, accepted=1.0, tokens=2.0, time=1.0)
    assert gate.scale == DraftGate.MAX_SCALE  # under-confidence is trusted only so far


class _Counting(CapeProposer):
    """Records, per step, whether the drafter ran (CAPE reads a confidence per drafter forward)."""

    def start(self, *args):
        super().start(*args)
        self.ran: list[bool] = []

    def propose(self, input_ids, max_depth):
        tree = super().propose(input_ids, max_depth)
        self.ran.append(bool(self.last_confidences))
        return tree


def test_cape_stops_drafting_where_its_drafts_do_not_pay():
    """A random drafter whose forward costs half a target forward: after a few steps the drafter runs only on
    probes; the output is plain greedy's. With a free drafter and free verification it drafts every step."""
    target = tiny_llama()
    drafter = _drafter(target)
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(0))
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False)
    ref = target.generate(prompt, **kw)
    runs = {}
    for name, budget in (
        ("dear", DraftBudget(CostCurve.linear(0.5), drafter_cost=0.5)),
        ("free", DraftBudget(CostCurve({1: 1.0, 2: 1.0}), drafter_cost=0.0)),
    ):
        proposer = _Counting(drafter, gamma=3, budget=budget)
        out = target.generate(prompt, custom_generate=tree_generate, proposer=proposer, **kw)
        assert torch.equal(out, ref), name
        runs[name] = proposer.ran
    assert all(runs["free"][:-1])  # the last step has no room for a draft
    assert sum(runs["dear"]) <= len(runs["dear"]) // 3, runs["dear"]
    assert any(runs["dear"][10:])  # probes go on


def test_pct_stops_drafting_where_its_trees_do_not_pay(target_and_edd):
    target, edd = target_and_edd
    prompt = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False)
    ref = target.generate(prompt, **kw)
    proposer = EddTreeProposer(edd, "pct", cost=DraftBudget(CostCurve.linear(0.5), drafter_cost=0.5))
    forwards = []
    original = proposer.grow

    def grow(expander, depth):
        forwards.append(1)
        return original(expander, depth)

    proposer.grow = grow
    stats = DecodeStats()
    out = target.generate(prompt, custom_generate=tree_generate, proposer=proposer, stats=stats, **kw)
    assert torch.equal(out, ref)
    assert len(forwards) <= stats.target_forwards // 3, (len(forwards), stats.target_forwards)


def test_space_feeds_masks_only_while_they_pay():
    """Where a step with masks costs many forwards SPACE decodes plainly but for probes; where masks are free it
    feeds them every step. Greedy output identical to plain decoding either way."""
    model = _peaked(tiny_llama(vocab_size=97), k=3)
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = model.generate(prompt, **kw)
    masked = {}
    for name, cost in (("free", CostCurve({1: 1.0, 2: 1.0})), ("steep", CostCurve.linear(3.0))):
        stats = DecodeStats()
        out = model.generate(prompt, custom_generate=hf_specdec.space, space_cost=cost, stats=stats, **kw)
        assert torch.equal(out, ref), name
        masked[name] = [s["nodes"] > 0 for s in stats.steps[1:-1]]  # after the prefill, before the last token
    assert all(masked["free"])
    assert sum(masked["steep"]) <= len(masked["steep"]) // 3 and any(masked["steep"][8:]), masked["steep"]


def test_the_measured_gate_is_kept_per_machine_setting(one_thread):
    """With the measured costs the gate lives on the drafter (like c_d), one per dtype, device and thread count."""
    from hf_specdec.core.draft_budget import shared_gate

    target = tiny_llama()
    drafter = _drafter(target)
    gate = shared_gate(drafter, target)
    assert shared_gate(drafter, target) is gate and shared_gate(_drafter(target), target) is not gate
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert shared_gate(drafter, target) is not gate
    finally:
        torch.set_num_threads(threads)


def test_a_step_that_verified_nothing_still_teaches_the_scale():
    """When the rule kept no node, the drafter's top token at the root is scored against the token the target
    emitted: a drafter whose scaled estimates were cut to nothing can still prove itself (else a closed gate could
    never learn); the step itself yielded one token for its cost."""
    gate = DraftGate()
    for _ in range(200):  # the running means span ~20 steps
        gate.verified((0.5, 1.1, 7), [7], 0)  # estimated 0.5, right every time
    assert gate.scale == DraftGate.MAX_SCALE and gate.rate == pytest.approx(1 / 1.1, rel=1e-3)
    for _ in range(200):  # the running means span ~20 steps
        gate.verified((0.5, 1.1, 7), [9], 0)  # wrong every time
    assert gate.scale < 0.01
    gate = DraftGate()
    gate.verified((1.5, 1.6, None), [3, 4, 5], 2)  # a verified tree: its accepted nodes count
    m = gate.momentum  # beside the prior: estimates right, drafting at break-even
    assert gate.scale == pytest.approx((m + (1 - m) * 2) / (m + (1 - m) * 1.5))
    assert gate.rate == pytest.approx((m + (1 - m) * 3) / (m + (1 - m) * 1.6))


def test_one_rejected_draft_does_not_zero_the_scale():
    """The running means start from a prior (estimates right), so a first miss only lowers the scale: before the
    prior it set it to 0, and every tree was cut to nothing until a top token happened to hit."""
    gate = DraftGate()
    gate.verified((0.6, 1.1, 7), [9], 0)
    assert 0.5 < gate.scale < 1.0


def test_a_probe_is_sized_on_the_drafters_own_estimates():
    """A closed gate's probe keeps the nodes the unscaled estimates pay for, so what verification accepts of them
    can raise ``rate``; sized by a fallen ``scale`` it would keep nothing and emit one token per probe forever."""
    budget = DraftBudget(CostCurve.linear(0.05), drafter_cost=0.05)
    estimates, depths = [0.9, 0.8, 0.7], [1, 2, 3]
    gate = DraftGate(max_gap=4)
    for _ in range(200):  # the running means span ~20 steps
        gate.verified((0.9, 1.1, 7), [9], 0)  # the top token wrong every time: scale near 0, gate closed
    assert gate.scale < 0.01 and gate.rate < 1
    drafted = []
    for _ in range(12):
        if gate.draft_now():
            kept, record = budget.keep_checked(gate, estimates, depths, 3, 7)
            drafted.append((gate.probing, kept))
    assert drafted and all(probing and kept == [0, 1, 2] for probing, kept in drafted), drafted
    gate.verified(record, [5, 6, 7, 8], 3)  # the probe's tree accepted whole
    for _ in range(12):  # and such probes reopen the gate
        if gate.draft_now() and gate.probing:
            kept, record = budget.keep_checked(gate, estimates, depths, 3, 7)
            gate.verified(record, [5, 6, 7, 8], 3)
    assert gate.rate >= 1 and gate.draft_now() and not gate.probing
    assert budget.keep_checked(gate, estimates, depths, 3, 7)[0] == [0, 1, 2]


def test_keep_takes_the_best_tree_where_small_trees_cost_more_than_larger_ones():
    """fp32 on a CPU: c(2), c(3) above c(4). One node of 0.5 does not pay for c(2) = 1.6, three nodes do at c(4)."""
    fp32 = DraftBudget(CostCurve({1: 1.0, 2: 1.6, 3: 2.0, 4: 1.5, 8: 1.5}), drafter_cost=0.1)
    estimates, depths = [0.5, 0.3, 0.25, 0.01], [1, 1, 2, 1]
    assert fp32.keep(estimates[:1], depths[:1]) == []
    assert fp32.keep(estimates, depths) == [0, 1, 2, 3]  # E / T = 2.06 / 1.6: the 4th node is free
    assert fp32.keep([0.2, 0.1, 0.05], [1, 1, 1]) == []  # 1.35 / 1.6 < 1: no tree pays
    # a convex curve: the same as adding nodes while e / (c(q + 1) - c(q)) >= E / T
    convex = DraftBudget(CostCurve.linear(0.2), drafter_cost=0.1)
    assert convex.keep(estimates, depths) == [0, 1, 2]  # 0.25 * 1.7 >= 1.8 * 0.2, 0.01 * 1.9 < 2.05 * 0.2


_FALLING = {1: 1.0, 2: 1.05, 3: 0.95, 4: 1.0, 8: 1.1, 64: 2.0}  # c(3) under c(2) by more than c_d = 0.05


def test_the_expansion_threshold_counts_a_falling_cost_as_flat():
    bf16 = DraftBudget(CostCurve(_FALLING), drafter_cost=0.05)
    assert bf16.expand_threshold(1) == pytest.approx(0.05)  # not 0.05 + 0.95 - 1.05 < 0
    assert not bf16.worth_drafting(0.04, 1) and bf16.worth_drafting(0.06, 1)
    assert (
        DraftBudget(CostCurve.linear(0.0), drafter_cost=0.0).expand_threshold(3) == 0.0
    )  # free: a chain drafts on


def test_a_falling_cost_curve_does_not_expand_the_whole_tree(target_and_edd, monkeypatch):
    """bf16 on a CPU: c(3) can fall below c(2) by more than c_d. The marginal cost then counts as 0: the threshold
    stays c_d, and a drafter forward extends only nodes of estimate >= c_d / scale (at most 1 / that per depth);
    at c_d + c(3) - c(2) < 0 PCT expanded every node, width ** depth of them."""
    from hf_specdec.edd import tree_proposer

    target, edd = target_and_edd
    widths = []
    expand = tree_proposer.EddTreeExpander.expand
    monkeypatch.setattr(
        tree_proposer.EddTreeExpander,
        "expand",
        lambda self, nodes, tree: widths.append(len(nodes)) or expand(self, nodes, tree),
    )
    prompt = torch.randint(3, 90, (1, 8), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False)
    bf16 = DraftBudget(CostCurve(_FALLING), drafter_cost=0.05)
    proposer = EddTreeProposer(edd, "pct", depth=4, cost=bf16)
    out = target.generate(prompt, custom_generate=tree_generate, proposer=proposer, **kw)
    assert torch.equal(out, target.generate(prompt, **kw))
    # the old threshold: 125 at the third forward
    assert max(widths) <= 1 / (0.05 / DraftGate.MAX_SCALE), widths
    # free drafting and verification (a threshold of 0): PCT still expands only nodes a kept child can come from
    widths.clear()
    free = EddTreeProposer(edd, "pct", depth=4, cost=DraftBudget(CostCurve.linear(0.0), drafter_cost=0.0))
    assert torch.equal(target.generate(prompt, custom_generate=tree_generate, proposer=free, **kw), out)
    assert max(widths) <= 1 / free.removal_threshold, widths


def _closed_share(momentum: float, seed: int, steps: int = 3000) -> float:
    """Share of steps a gate keeps closed for a drafter worth 1.25x on average: each drafted step accepts 0-3 tokens
    (probabilities 0.55, 0.30, 0.12, 0.03) at a modelled cost T = 1.3."""
    rng, gate, closed = random.Random(seed), DraftGate(momentum=momentum), 0
    for _ in range(steps):
        if not gate.draft_now():
            closed += 1
            continue
        accepted = rng.choices(range(4), (0.55, 0.30, 0.12, 0.03))[0]
        gate.outcome(1.0, accepted, 1.0 + accepted, 1.3)
    return closed / steps


def test_a_drafter_that_pays_keeps_the_gate_open_through_its_noise():
    """The running means span ~20 steps: noise in a paying drafter's yield seldom closes the gate (over ~7 steps,
    momentum 0.85, it closed ~28% of the steps), while a drafter that does not pay still closes it at once."""
    assert DraftGate().momentum == 0.95
    shares = [_closed_share(DraftGate().momentum, seed) for seed in range(8)]
    assert sum(shares) / len(shares) < 0.08, shares
    assert sum(_closed_share(0.85, seed) for seed in range(8)) / 8 > 0.15  # the old span, for contrast
    gate = DraftGate()
    gate.outcome(1.0, 0.0, 1.0, 1.6)  # one step that yielded 1 token at 1.6 forwards
    assert gate.rate < 1 and gate.draft_now() and gate.probing  # closed: the next draft is a probe


def test_a_closed_gate_reopens_after_a_probe_or_two_that_pay():
    """A probe stands for the steps since the last one: it weighs 0.15, not an open step's 0.05, so a gate closed by
    a stretch where drafting did not pay reopens as soon as probes show it pays again (at 0.05 it took ~10)."""
    gate = DraftGate()
    for _ in range(100):  # drafting does not pay: 1 token per step at 1.6 forwards
        if gate.draft_now():
            gate.outcome(1.0, 0.0, 1.0, 1.6)
    probes = 0
    while not (gate.draft_now() and not gate.probing):
        if gate.probing:  # now it pays: 3 tokens per probe at 1.3 forwards
            probes += 1
            gate.outcome(1.0, 2.0, 3.0, 1.3)
    assert probes <= 2, probes
    slow = DraftGate()
    for _ in range(100):
        if slow.draft_now():
            slow.outcome(1.0, 0.0, 1.0, 1.6)
    for _ in range(3):
        slow.outcome(1.0, 2.0, 3.0, 1.3, probe=False)  # the same three outcomes at an open step's weight
    assert slow.rate < 1
