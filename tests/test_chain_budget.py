"""Cost-sized chains: GLIDE's and EDD's ``assistant_model`` chains run in the tree core's loop and are sized by the
same rule as the trees (``core/draft_budget.DraftBudget``): they stop at a draft token that does not pay its cost,
answer to the draft gate, and stay lossless."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM

from hf_specdec.core.assisted import batch_stats
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.edd import tree_proposer
from hf_specdec.glide import cape

from .conftest import tiny_llama


def _pair(kind: str):
    target = tiny_llama(num_hidden_layers=4)
    torch.manual_seed(0)
    if kind == "edd":
        drafter = EddForCausalLM(EddConfig.for_target(target))
    else:
        drafter = GlideForCausalLM(GlideConfig.for_target(target))
    drafter.attach_target(target).eval().init_from_target(target)
    drafter.generation_config.num_assistant_tokens = 4
    return target, drafter


def _costs(monkeypatch, curve, c_d):
    for module in (cape, tree_proposer):
        monkeypatch.setattr(module, "measured_cost", lambda *a, **k: curve)
        monkeypatch.setattr(module, "measured_drafter_cost", lambda *a, **k: c_d)


@pytest.mark.parametrize("kind", ["glide", "edd"])
@pytest.mark.parametrize("pays", [True, False])
def test_chains_draft_what_pays_and_stay_lossless(monkeypatch, kind, pays):
    """Verifying free and drafting free: every chain is gamma long. Each verified token costing a whole forward and
    a drafter forward two: a confident first draft may be kept but never a second drafter forward."""
    _costs(monkeypatch, *((CostCurve({1: 1.0, 2: 1.0}), 0.0) if pays else (CostCurve.linear(1.0), 2.0)))
    target, drafter = _pair(kind)
    drafter.config.confidence_temperature = 0.05  # sharp confidences: the first draft is kept
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 5, 17, 33]])
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    with batch_stats() as stats:
        out = target.generate(ids, assistant_model=drafter, **kw)
    assert torch.equal(out, target.generate(ids, **kw))
    drafted = [s["nodes"] for s in stats.steps if s["nodes"]]
    if pays:
        assert drafted and max(drafted) == 4, stats.steps
    else:  # at most the first token; the gate may stop even that once a kept draft was rejected (next test)
        assert max(drafted, default=0) <= 1, stats.steps


@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_chains_stop_drafting_where_their_drafts_do_not_pay(monkeypatch, kind):
    """The chains answer to the DraftGate: a random drafter whose forward costs half a target forward runs only on
    probes after a few steps (no draft: a plain step), with probes still coming late in the generation; free
    drafting drafts every step. The output is plain greedy's."""
    target, drafter = _pair(kind)
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 5, 17, 33]])
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = target.generate(ids, **kw)
    ran, runs = set(), {}  # the steps (by their index in stats.steps) in which the drafter ran
    last_layer = drafter.decoder if kind == "edd" else drafter.norm  # runs once per drafter forward
    last_layer.register_forward_hook(lambda *_: ran.add(len(current.steps)))
    for name, curve, c_d in (
        ("dear", CostCurve.linear(0.5), 0.5),
        ("free", CostCurve({1: 1.0, 2: 1.0}), 0.0),
    ):
        _costs(monkeypatch, curve, c_d)
        drafter.__dict__.pop("_hf_specdec_draft_gates", None)  # a fresh gate for each cost model
        ran.clear()
        with batch_stats() as current:
            assert torch.equal(target.generate(ids, assistant_model=drafter, **kw), ref), name
        runs[name] = [i in ran for i in range(2, len(current.steps))]  # drafted for step i, after the first
    steps = runs["dear"]
    assert sum(steps) <= len(steps) // 3 and any(steps[len(steps) // 2 :]), runs["dear"]
    assert all(runs["free"][:-1]), runs["free"]


@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_chain_cost_off_drafts_gamma_every_step(monkeypatch, kind):
    """``chain_cost = False``: the papers' fixed gamma, whatever the costs."""
    _costs(monkeypatch, CostCurve.linear(3.0), 5.0)
    target, drafter = _pair(kind)
    drafter.chain_cost = False
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 5, 17, 33]])
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    with batch_stats() as stats:
        out = target.generate(ids, assistant_model=drafter, **kw)
    assert torch.equal(out, target.generate(ids, **kw))
    # the first five steps after the prefill (at most 26 tokens: none is cut by max_new_tokens)
    assert [s["nodes"] for s in stats.steps[1:6]] == [4] * 5, stats.steps
