"""``hf-specdec bench --kernels`` and ``--cold``: the kernels every model of a run uses, ``ar-stock`` (the run's
plain ``generate`` on stock kernels, ``hf_specdec/kernels.py``), and the speedups of each method's first call."""

from __future__ import annotations

from ..kernels import apply_kernels

STOCK = "ar-stock"  # --kernels other than stock: plain generate of a copy of the target on stock kernels


def apply_run_kernels(runners: dict, target, kernels: str) -> dict[str, str]:
    """``apply_kernels`` on every model the run decodes with (the target, each method's drafter and own model),
    except ``ar-stock``'s copy; returns each report as text by model."""
    reports, done = {"target": str(apply_kernels(target, kernels))}, {id(target)}
    for name, runner in runners.items():
        if name == STOCK:
            continue
        for what, model in (("model", runner.model), ("drafter", runner.drafter)):
            if model is not None and id(model) not in done:
                done.add(id(model))
                reports[f"{name} {what}"] = str(apply_kernels(model, kernels))
    return reports


def add_stock_speedups(runs: list[dict]) -> list[dict]:
    """With ``ar-stock`` in the run: each run's ``speedup_vs_stock``, its tokens/s over ``ar-stock``'s (added to
    ``runs``, which it returns)."""
    stock = {r["task"]: r["tokens_per_s"] for r in runs if r["method"] == STOCK}
    for r in runs:
        if stock.get(r["task"]):
            r["speedup_vs_stock"] = round(r["tokens_per_s"] / stock[r["task"]], 4)
    return runs


def first_call_speedups(per_prompt: dict, names: list[str], task: str) -> dict[str, float]:
    """``--cold``: each method's tokens/s on the run's first prompt (its first call in the process) over ``ar``'s."""

    def tps(name: str) -> float:
        first = per_prompt[f"{name}/{task}"][0]
        return first["new_tokens"] / first["total_time"] if first["total_time"] else 0.0

    ref = tps(names[0])
    return {name: round(tps(name) / ref, 4) for name in names} if ref else {}
