import torch

from hf_specdec.verify_cost import SIZES, CostCurve, interpolate, measured_cost, monotone
from tests.conftest import tiny_llama


def test_interpolation_and_extrapolation():
    times = {1: 1.0, 4: 2.5, 16: 4.0}
    assert interpolate(times, 1) == 1.0 and interpolate(times, 2) == 1.5 and interpolate(times, 10) == 3.25
    assert interpolate(times, 28) == 5.5  # the last segment's slope, continued


def test_cost_curve_is_relative_to_one_token_and_never_below_it():
    curve = CostCurve({1: 0.02, 4: 0.03, 16: 0.05})
    assert curve(1) == 1.0 and abs(curve(4) - 1.5) < 1e-9 and abs(curve(16) - 2.5) < 1e-9 and curve(2) > 1.0
    assert abs(CostCurve.linear(0.1)(11) - 2.0) < 1e-9


def test_cost_curve_is_monotone_in_the_query_length():
    # timing noise: a 16-token forward measured faster than a 4-token one is pooled with it (least squares)
    curve = CostCurve({1: 0.02, 4: 0.04, 16: 0.03, 64: 0.08})
    assert abs(curve(4) - 1.75) < 1e-9 and abs(curve(16) - 1.75) < 1e-9 and abs(curve(64) - 4.0) < 1e-9
    # a slow one-token round pooled with faster longer ones: nothing is cheaper than a plain step
    curve = CostCurve({1: 0.05, 4: 0.03, 16: 0.04})
    assert curve(4) == curve(16) == 1.0
    assert monotone([3.0, 1.0, 2.0, 5.0]) == [2.0, 2.0, 2.0, 5.0]


def test_measured_once_per_model_and_dtype():
    model = tiny_llama()
    context = torch.arange(3, 40)
    curve = measured_cost(model, context, repeats=1)
    assert measured_cost(model, context) is curve  # cached on the model: no second timing
    assert sorted(curve.relative) == list(SIZES) and curve(1) == 1.0
    assert measured_cost(tiny_llama(), context, repeats=1) is not curve
