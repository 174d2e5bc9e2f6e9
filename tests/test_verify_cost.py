import pytest
import torch

from hf_specdec.core import verify_cost
from hf_specdec.core.verify_cost import (
    PRIOR,
    CostCurve,
    CostObserver,
    LearnedCurve,
    interpolate,
    measured_cost,
)
from tests.conftest import tiny_llama


def test_interpolation_and_extrapolation():
    times = {1: 1.0, 4: 2.5, 16: 4.0}
    assert interpolate(times, 1) == 1.0 and interpolate(times, 2) == 1.5 and interpolate(times, 10) == 3.25
    assert interpolate(times, 28) == 5.5  # the last segment's slope, continued


def test_cost_curve_is_relative_to_one_token_and_never_below_it():
    curve = CostCurve({1: 0.02, 4: 0.03, 16: 0.019})  # a noisy measurement below t(1) is clamped to 1
    assert curve(1) == 1.0 and abs(curve(4) - 1.5) < 1e-9 and curve(16) == 1.0 and curve(2) > 1.0
    assert abs(CostCurve.linear(0.1)(11) - 2.0) < 1e-9


def test_one_learnt_curve_per_model_and_setting_starting_from_the_prior(monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("generate's curve must not be timed")

    monkeypatch.setattr(verify_cost, "forward_times", no_timing)
    model = tiny_llama()
    context = torch.arange(3, 40)
    curve = measured_cost(model, context)
    assert isinstance(curve, LearnedCurve) and measured_cost(model, context) is curve  # kept on the model
    assert curve.relative == PRIOR and curve(1) == 1.0
    assert measured_cost(tiny_llama(), context) is not curve


def test_the_learnt_curve_asks_for_plain_steps_and_follows_its_samples():
    curve = LearnedCurve(PRIOR)
    for q in (1, 2, 4, 8):
        curve.observe(q, 1.0)  # the first forward of each size is a warm-up: no sample
    assert curve.needs_plain()  # no t(1) yet: the first steps draft nothing
    curve.observe(1, 0.010)
    assert curve.needs_plain() and curve(2) == pytest.approx(PRIOR[2])
    curve.observe(1, 0.010)
    assert not curve.needs_plain()
    for t in (0.016, 0.030):  # the second sample slowed by the machine: the fastest counts
        curve.observe(2, t)
        curve.observe(4, t * 1.25)
    assert curve(2) == pytest.approx(1.6) and curve(4) == pytest.approx(2.0)
    assert curve(3) == pytest.approx(1.8)  # between two sizes seen: interpolated
    assert curve(16) == pytest.approx(2.0 * PRIOR[16] / PRIOR[4])  # beyond them: the prior's shape
    curve.observe(8, 0.5)
    assert curve(8) == pytest.approx(2.0 * PRIOR[8] / PRIOR[4])  # one sample of a size is not yet trusted
    for _ in range(LearnedCurve.REFRESH):
        curve.observe(2, 0.016)
    assert curve.needs_plain()  # t(1) has grown old: a plain step again
    curve.observe(1, 0.008)
    assert not curve.needs_plain() and curve(2) == pytest.approx(2.0)  # the fastest t(1) of the window: 0.008


def test_every_size_is_timed_over_the_same_window():
    """t(q) and t(1) are each the fastest of their last WINDOW samples: a fast q = 2 sample older than that no longer
    counts, as an old t(1) does not (the fastest of many samples would make c(2) look cheaper than it is)."""
    curve = LearnedCurve(PRIOR)
    for q in (1, 2):
        curve.observe(q, 1.0)  # warm-ups
    for t in (0.010, 0.011, 0.010, 0.012):
        curve.observe(1, t)
    curve.observe(2, 0.010)  # one fast sample, then the size's usual time
    for _ in range(LearnedCurve.WINDOW):
        curve.observe(2, 0.014)
    assert curve(2) == pytest.approx(1.4)


def test_the_observer_feeds_the_curve_the_generation_uses():
    model = tiny_llama()
    context = torch.arange(3, 40)
    assert CostObserver(model, 37).curve is None  # no method asked for a curve: nothing is timed
    curve = measured_cost(model, context)
    observer = CostObserver(model, 37)
    assert observer.curve is curve and CostObserver(model, 300).curve is None  # another context bucket
    for q in (1, 1, 1, 3, 3, 3):
        observer.stop(q, observer.start())
    assert [len(curve.samples[q]) for q in (1, 3)] == [2, 2] and 3 in curve.relative  # after a warm-up each


def test_a_long_prompt_gets_a_curve_of_its_context():
    model = tiny_llama()
    short = verify_cost.measured_cost(model, torch.arange(3, 40))
    long = verify_cost.measured_cost(model, torch.arange(300) % 90 + 3)
    assert long is not short and verify_cost.measured_cost(model, torch.arange(3, 60)) is short
    assert verify_cost.context_bucket(300) == 256 and verify_cost.context_bucket(10) == 64
    assert any("context 256" in label for label in verify_cost.cached_curves(model))


def test_a_curve_no_loop_feeds_stops_asking_for_plain_steps():
    curve = LearnedCurve(PRIOR)
    curve.observe(1, 0.01)  # a warm-up
    asked = [curve.needs_plain() for _ in range(LearnedCurve.UNANSWERED + 3)]
    assert asked == [True] * LearnedCurve.UNANSWERED + [False] * 3  # then drafts on its prior
    curve.observe(1, 0.01)
    assert curve.needs_plain()  # a loop feeds it after all: it asks again
