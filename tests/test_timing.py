"""core/timing.py: timed regions wait for a CUDA device (mocked here), and every measured cost goes through it
(the verification cost curve behind PLD+'s adaptive K and CAPE's trim, PCT's StepTimer) with the model's device."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM

import hf_specdec
from hf_specdec.core import timing
from hf_specdec.core.tree_decoding import tree_generate
from hf_specdec.core.verify_cost import forward_times
from hf_specdec.edd.tree_proposer import EddTreeProposer

from .conftest import tiny_llama


def _record(monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(timing, "synchronize", lambda device: calls.append(torch.device(device)))
    return calls


def test_clock_synchronises_a_cuda_device_and_not_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timing.clock(torch.device("cuda", 1))
    assert calls == [torch.device("cuda", 1)]
    timing.seconds(lambda: None, "cuda:0")
    assert len(calls) == 1 + 2 and calls[-1] == torch.device("cuda", 0)
    timing.clock("cpu")
    timing.seconds(lambda: None, torch.device("cpu"))
    assert len(calls) == 3  # nothing to wait for on the CPU


def test_the_timed_curve_times_through_the_helper_and_generate_times_nothing(monkeypatch):
    calls = _record(monkeypatch)
    model = tiny_llama()
    forward_times(model, torch.arange(3, 40), sizes=(1, 4), repeats=2)
    assert calls == [torch.device("cpu")] * (2 * 2 * 2)  # start and end of every timed forward
    calls.clear()
    prompt = torch.tensor([[1, 5, 6, 7, 5, 6, 7, 5, 6]])
    # the learnt c(q) times the loop's own forwards with DeviceTimer marks: no timed forward, no wait
    model.generate(prompt, max_new_tokens=3, do_sample=False, custom_generate=hf_specdec.pld_plus)
    assert calls == []


def test_cost_curve_times_its_sizes_back_to_back(monkeypatch):
    """c(q) from interleaved samples: with the machine's speed drifting 1x to 9x between samples, the curve still
    holds the true ratio t(4) / t(1) = 2.5 (each sample times every size back to back; timing all of q = 1 first,
    then all of q = 4, would put the drift into the ratio)."""
    from hf_specdec.core import verify_cost

    order = iter(range(100))

    def drifting(fn, device):
        fn()
        i = next(order)  # sample i // 2; q = 1, then q = 4 in each
        return (1.0, 2.5)[i % 2] * (1 + i // 2)

    monkeypatch.setattr(verify_cost, "seconds", drifting)
    times = forward_times(tiny_llama(), torch.arange(3, 40), sizes=(4, 1), repeats=9)
    assert times[4] / times[1] == pytest.approx(2.5) and verify_cost.CostCurve(times)(4) == pytest.approx(2.5)


def test_pct_step_timer_times_through_the_helper(monkeypatch):
    calls = _record(monkeypatch)
    target = tiny_llama()
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    # the paper's PCT (no cost rule, no fixed ratio): calibrated, then s_d / s_t measured every step
    proposer = EddTreeProposer(edd, "pct", cost=False)
    target.generate(
        torch.tensor([[1, 5, 6, 7]]), max_new_tokens=4, custom_generate=tree_generate, proposer=proposer
    )
    assert proposer.calibrated and proposer.timer.s_d is not None and proposer.timer.s_t is not None
    assert len(calls) >= 4 and set(calls) == {torch.device("cpu")}
    # under the cost rule (the default) the costs are measured once, and nothing is timed while decoding
    proposer = EddTreeProposer(edd, "pct")
    target.generate(
        torch.tensor([[1, 5, 6, 7]]), max_new_tokens=4, custom_generate=tree_generate, proposer=proposer
    )
    assert proposer.budget is not None and proposer.timer.s_d is None and proposer.timer.s_t is None


def test_decoding_statistics_time_through_the_helper(monkeypatch):
    """The reported draft / verify / total times (tree decoding, the bench's ForwardMeter) wait for the device too."""
    from hf_specdec.core.ngram_tree import NGramTreeProposer
    from hf_specdec.core.stats import DecodeStats, ForwardMeter

    calls = _record(monkeypatch)
    model = tiny_llama()
    ids = torch.arange(3, 30)[None]
    stats = DecodeStats()
    with ForwardMeter(model) as meter:
        model.generate(
            ids,
            max_new_tokens=6,
            do_sample=False,
            custom_generate=tree_generate,
            proposer=NGramTreeProposer(),
            stats=stats,
        )
    assert meter.calls >= 2 and set(calls) == {torch.device("cpu")}
    # per forward: ForwardMeter's start and end, the loop's verify start and end; plus the loop's draft and total
    assert len(calls) >= 4 * meter.calls + 2


def test_drafter_cost_times_both_sides_back_to_back(monkeypatch):
    """c = s_d / s_t from interleaved samples: a machine whose speed drifts between samples (here 1x to 9x) still
    gives the drafter's true ratio, as every sample times the target step and the drafter step back to back (timed
    as two separate medians, the drift would enter the ratio). Every call goes through the device-aware helper."""
    from hf_specdec.core import drafter_cost as cost

    calls = _record(monkeypatch)
    target = tiny_llama()
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    edd.attach_target(target)
    assert cost.drafter_cost(edd, target, context=8, repeats=3) > 0
    assert set(calls) == {torch.device("cpu")} and len(calls) == 2 * 3 * 3  # target, layer, head per sample

    speeds = iter(s for s in range(1, 10) for _ in range(3))  # one speed per sample: target, layer, head

    def drifting(fn, device):
        fn()
        speed = next(speeds)
        return {"target_step": 1.0, "layer_step": 0.25}.get(getattr(fn, "__name__", ""), 0.05) * speed

    monkeypatch.setattr(cost, "seconds", drifting)
    assert cost.drafter_cost(edd, target, context=8, repeats=9) == pytest.approx(0.3)
