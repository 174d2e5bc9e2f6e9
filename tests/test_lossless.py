"""The tie-aware losslessness check: a planted divergence at a non-tie is caught, a real near-tie passes."""

import torch

from hf_specdec.core.lossless import compare_outputs


def _greedy(model, prompt, n):
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, prompt.shape[1] :].tolist()


def test_identical_and_fp32_mismatch(tiny_model):
    prompt = torch.tensor([[5, 6, 7, 8]])
    ref = _greedy(tiny_model, prompt, 10)
    assert compare_outputs(tiny_model, prompt, ref, list(ref), None).lossless
    bad = ref[:4] + [(ref[4] + 1) % 97] + ref[5:]
    v = compare_outputs(tiny_model, prompt, ref, bad, None)
    assert not v.lossless and v.first_diff == 4


def test_planted_divergence_at_non_tie_is_caught_and_tie_passes(tiny_model):
    prompt = torch.tensor([[5, 6, 7, 8]])
    ref = _greedy(tiny_model, prompt, 10)
    with torch.no_grad():
        logits = tiny_model(torch.tensor([prompt[0].tolist() + ref[:3]])).logits[0, -1]
    order = logits.argsort(descending=True).tolist()
    assert order[0] == ref[3]
    second, worst = order[1], order[-1]
    gap2 = (logits[order[0]] - logits[second]).item()
    worst_gap = (logits[order[0]] - logits[worst]).item()
    # A divergence to the runner-up within tolerance is a near-tie ...
    v = compare_outputs(tiny_model, prompt, ref, ref[:3] + [second] + ref[4:], tie_tol=gap2 * 1.01 + 1e-6)
    assert v.lossless and not v.identical and v.first_diff == 3 and abs(v.gap - gap2) < 1e-4
    # ... but not when the gap exceeds the tolerance, nor to a far-off token.
    assert not compare_outputs(
        tiny_model, prompt, ref, ref[:3] + [second] + ref[4:], tie_tol=gap2 * 0.5
    ).lossless
    v = compare_outputs(tiny_model, prompt, ref, ref[:3] + [worst] + ref[4:], tie_tol=gap2 * 1.01 + 1e-6)
    assert not v.lossless and v.gap > worst_gap - 1e-4


def test_early_stop_is_not_lossless(tiny_model):
    prompt = torch.tensor([[5, 6, 7, 8]])
    ref = _greedy(tiny_model, prompt, 8)
    v = compare_outputs(tiny_model, prompt, ref, ref[:5], tie_tol=100.0)
    assert not v.lossless and "length differs" in v.reason


def test_the_tolerance_is_two_units_of_the_dtype_at_the_top_logit():
    """bf16 resolves a logit in [16, 32) to 0.125 and one in [32, 64) to 0.25: the default 0.25 is two units below
    32 and grows to 0.5 from there; fp32's units never reach a bf16 default; a larger tie_tol is kept."""
    from hf_specdec.core.lossless import tie_tolerance

    bf16 = torch.bfloat16
    assert tie_tolerance(0.25, 31.9, bf16) == 0.25 and tie_tolerance(0.25, -20.0, bf16) == 0.25
    assert tie_tolerance(0.25, 32.0, bf16) == 0.5 and tie_tolerance(0.25, 70.0, bf16) == 1.0
    assert tie_tolerance(0.25, 2.0, bf16) == 0.25  # never below tie_tol
    assert tie_tolerance(0.05, 40.0, torch.float32) == 0.05 and tie_tolerance(2.0, 32.0, bf16) == 2.0
    # a bf16 model judged at its own logits: 32.0 vs 31.625 is within two units of 32 (0.5), 31.0 is not
    assert 32.0 - 31.625 <= tie_tolerance(0.25, 32.0, bf16) < 32.0 - 31.0
