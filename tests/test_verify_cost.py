import torch

from hf_specdec.core.verify_cost import SIZES, CostCurve, interpolate, measured_cost
from tests.conftest import tiny_llama


def test_interpolation_and_extrapolation():
    times = {1: 1.0, 4: 2.5, 16: 4.0}
    assert interpolate(times, 1) == 1.0 and interpolate(times, 2) == 1.5 and interpolate(times, 10) == 3.25
    assert interpolate(times, 28) == 5.5  # the last segment's slope, continued


def test_cost_curve_is_relative_to_one_token_and_never_below_it():
    curve = CostCurve({1: 0.02, 4: 0.03, 16: 0.019})  # a noisy measurement below t(1) is clamped to 1
    assert curve(1) == 1.0 and abs(curve(4) - 1.5) < 1e-9 and curve(16) == 1.0 and curve(2) > 1.0
    assert abs(CostCurve.linear(0.1)(11) - 2.0) < 1e-9


def test_measured_once_per_model_and_dtype():
    model = tiny_llama()
    context = torch.arange(3, 40)
    curve = measured_cost(model, context, repeats=1)
    assert measured_cost(model, context) is curve  # cached on the model: no second timing
    assert sorted(curve.relative) == list(SIZES) and curve(1) == 1.0
    assert measured_cost(tiny_llama(), context, repeats=1) is not curve


def test_a_long_prompt_gets_a_curve_timed_at_its_context():
    from hf_specdec.core import verify_cost

    model = tiny_llama()
    short = verify_cost.measured_cost(model, torch.arange(3, 40), repeats=1)
    long = verify_cost.measured_cost(model, torch.arange(300) % 90 + 3, repeats=1)
    assert long is not short and verify_cost.measured_cost(model, torch.arange(3, 60), repeats=1) is short
    assert verify_cost.context_bucket(300) == 256 and verify_cost.context_bucket(10) == 64
    assert any("context 256" in label for label in verify_cost.cached_curves(model))
