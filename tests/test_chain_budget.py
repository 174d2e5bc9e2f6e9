"""Cost-sized chains (issue #31 point 3): GLIDE's and EDD's ``assistant_model`` chains stop at a draft token that does
not pay its cost (``core/draft_budget.ChainSizer``), and stay lossless."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM

from hf_specdec.core import chain_drafting
from hf_specdec.core.draft_budget import ChainSizer, DraftBudget
from hf_specdec.core.verify_cost import CostCurve

from .conftest import tiny_llama


def test_chain_sizer_hand_computation():
    """c(q) = 1 + 0.5 (q - 1), c_d = 0.1: keep while e * T >= E * 0.5, draft on while e >= 0.1 + 0.5."""
    sizer = ChainSizer(DraftBudget(CostCurve.linear(0.5), drafter_cost=0.1))
    sizer.start()  # T = 1.1, E = 1
    assert sizer.take(0.9) == (True, True)  # e 0.9: 0.99 >= 0.5; T 1.6 + 0.1, E 1.9
    assert sizer.take(0.9) == (True, True)  # e 0.81: 1.377 >= 0.95; T 2.2 + 0.1, E 2.71
    assert sizer.take(0.5) == (False, False)  # e 0.405: 0.93 < 1.355
    sizer.start()
    assert sizer.take(0.55) == (True, False)  # kept (0.605 >= 0.5) but 0.55 < 0.6: no further forward
    assert ChainSizer(None).take(1e-9) == (True, True)  # no budget: the papers' fixed gamma


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


@pytest.mark.parametrize("kind", ["glide", "edd"])
@pytest.mark.parametrize("pays", [True, False])
def test_chains_draft_what_pays_and_stay_lossless(monkeypatch, kind, pays):
    """Verifying free and drafting free: every chain is gamma long. Each verified token costing a whole forward and
    a drafter forward two: a confident first draft may be kept (p * 3 >= 1) but never a second drafter forward."""
    curve, c_d = (CostCurve({1: 1.0, 2: 1.0}), 0.0) if pays else (CostCurve.linear(1.0), 2.0)
    monkeypatch.setattr(chain_drafting, "measured_cost", lambda *a, **k: curve)
    monkeypatch.setattr(chain_drafting, "measured_drafter_cost", lambda *a, **k: c_d)
    target, drafter = _pair(kind)
    drafter.config.confidence_temperature = 0.05  # sharp confidences: the first draft is kept
    generator_class = type(drafter.make_candidate_generator(target, target.generation_config, None))
    lengths, original = [], generator_class.get_candidates

    def spy(self, input_ids, **kw):
        out, logits = original(self, input_ids, **kw)
        lengths.append(out.shape[1] - input_ids.shape[1])
        return out, logits

    monkeypatch.setattr(generator_class, "get_candidates", spy)
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 5, 17, 33]])
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    out = target.generate(ids, assistant_model=drafter, **kw)
    assert torch.equal(out, target.generate(ids, **kw))
    drafted = [n for n in lengths if n]
    if pays:
        assert drafted and max(drafted) == 4, lengths
    else:  # at most the first token; the gate may stop even that once a kept draft was rejected (next test)
        assert max(drafted, default=0) <= 1, lengths


@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_chains_stop_drafting_where_their_drafts_do_not_pay(monkeypatch, kind):
    """The chains answer to the DraftGate too (``chain_drafting.chain_start``): a random drafter whose forward costs
    half a target forward runs only on probes after a few steps (the drafter idle, no candidate: a plain step), with
    probes still coming late in the generation; free drafting drafts every step. The output is plain greedy's."""
    target, drafter = _pair(kind)
    generator_class = type(drafter.make_candidate_generator(target, target.generation_config, None))
    ran, original = [], generator_class.get_candidates

    def spy(self, input_ids, **kw):
        out = original(self, input_ids, **kw)
        ran.append(self.pending is not None)  # the step drafted (its record waits for the verification)
        return out

    monkeypatch.setattr(generator_class, "get_candidates", spy)
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 5, 17, 33]])
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = target.generate(ids, **kw)
    runs = {}
    for name, curve, c_d in (
        ("dear", CostCurve.linear(0.5), 0.5),
        ("free", CostCurve({1: 1.0, 2: 1.0}), 0.0),
    ):
        monkeypatch.setattr(chain_drafting, "measured_cost", lambda *a, curve=curve, **k: curve)
        monkeypatch.setattr(chain_drafting, "measured_drafter_cost", lambda *a, c_d=c_d, **k: c_d)
        drafter.__dict__.pop("_hf_specdec_draft_gates", None)  # a fresh gate for each cost model
        ran.clear()
        assert torch.equal(target.generate(ids, assistant_model=drafter, **kw), ref), name
        runs[name] = list(ran)
    steps = runs["dear"][2:]  # GLIDE's first round is the target's prefill
    assert sum(steps) <= len(steps) // 3 and any(steps[len(steps) // 2 :]), runs["dear"]
    assert all(runs["free"][2:-1]), runs["free"]
