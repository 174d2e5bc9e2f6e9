"""From the bench's records to its figures: a (method, task)'s speed, tau, alpha and losslessness (:func:`aggregate`),
the drafter cost c per method, the costs the drafts were sized by (:func:`sizing_costs`), and the per-step split: where a step's time goes (target forwards, drafter forwards, overhead),
in ms and in one-token forwards of the same run, and the host syncs per step of the untimed counting pass. The meters
that fill the records are ``core/stats.ForwardMeter`` / ``DrafterMeter`` and ``core/host_syncs.HostSyncCounter``
(through ``methods.metered`` / ``run_row``); ``docs/results.md#how-the-bench-measures`` explains the table."""

from __future__ import annotations

from hf_specdec.core.lossless import compare_outputs
from hf_specdec.core.timing import median


def one_token_forward(records: list[dict]) -> float | None:
    """The median one-token target forward of ``ar``'s ``records`` (seconds): the unit of the per-step split."""
    times = [r["one_token_forward"] for r in records if r.get("one_token_forward")]
    return median(times) if times else None


def step_split(records: list[dict], unit: float | None, syncs: list[int] | None = None) -> dict:
    """The per-step time split of a (method, task): target forwards, drafter forwards and overhead (the rest of the
    wall time) per step (one target forward call), in ms and in ``unit`` (the run's one-token forward); and the host
    syncs per step of the untimed counting pass (``syncs``: syncs and steps of each counted generation)."""
    steps = sum(r.get("forwards", 0) for r in records)
    if not steps:
        return {}
    target = sum(r["target_time"] for r in records) / steps
    drafter = sum(r["drafter_time"] for r in records) / steps
    overhead = sum(r["total_time"] for r in records) / steps - target - drafter
    split = {
        "steps": steps,
        "target_ms": round(1000 * target, 3),
        "drafter_ms": round(1000 * drafter, 3),
        "overhead_ms": round(1000 * overhead, 3),
        "one_token_forward_ms": round(1000 * unit, 3) if unit else None,
    }
    if unit:
        split.update(
            target_fwd=round(target / unit, 4),
            drafter_fwd=round(drafter / unit, 4),
            overhead_fwd=round(overhead / unit, 4),
        )
    if syncs:
        split["syncs_per_step"] = round(sum(s for s, _ in syncs) / max(sum(n for _, n in syncs), 1), 2)
    return split


def measure_drafter_costs(runners: dict, target) -> dict[str, float]:
    """c per drafter method (``core.drafter_cost``): one draft forward over one target forward, timed here; a
    drafter shared by several methods is timed once."""
    from ..core.draft_budget import set_drafter_cost
    from ..core.drafter_cost import drafter_cost

    timed: dict[int, float] = {}
    costs = {}
    for name, runner in runners.items():
        if runner.drafter is not None:
            key = id(runner.drafter)
            if key not in timed:
                timed[key] = drafter_cost(runner.drafter, target)
                set_drafter_cost(runner.drafter, target, timed[key])  # what later generations size by
            costs[name] = round(timed[key], 4)
    return costs


def sizing_costs(runners: dict, target) -> dict:
    """The costs the cost-sized drafts of this run were sized by, as the generations learnt them (starting from the
    cost store, ``core/cost_store.py``; ``core/verify_cost.measured_cost`` and
    ``core/draft_budget.measured_drafter_cost``): the verification cost curve ``c(q)`` of each decoded model
    (``"target"``, or the method that decodes a model of its own) and each drafter method's ``c_d``. The tree sizes,
    and so tau, of two runs of the same command differ with these; the record says by how much they differed."""
    from ..core.draft_budget import cached_drafter_costs
    from ..core.verify_cost import cached_curves

    curves, drafters = {}, {}
    for name, runner in runners.items():
        label = "target" if runner.model is target else name
        measured = {
            s: {str(q): round(c, 3) for q, c in curve.relative.items()}
            for s, curve in cached_curves(runner.model).items()
        }
        if measured:
            curves[label] = measured
        timed = cached_drafter_costs(runner.drafter) if runner.drafter is not None else {}
        if timed:
            drafters[name] = {s: round(c, 4) for s, c in timed.items()}
    return {"verify_curve": curves, "drafter_c": drafters}


def aggregate(
    method: str, task: str, records: list[dict], ref_tps: float | None, rows: list[dict] | None = None
) -> dict:
    """Figures of one (method, task): timing and stats from ``records`` (one per prompt at batch 1, one per batch
    above), losslessness from ``rows`` (one per prompt; default ``records``)."""
    rows = records if rows is None else rows
    sampled = any(r["lossless"] is None for r in rows)
    tokens = sum(r["new_tokens"] for r in records)
    seconds = sum(r["total_time"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    drafted = sum(r["drafted"] for r in records)
    tps = tokens / seconds if seconds else 0.0
    return {
        "method": method,
        "task": task,
        "n_prompts": len(rows),
        "new_tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tps, 3),
        "speedup": round(tps / ref_tps, 4) if ref_tps else None,
        "tau": round(tokens / forwards, 4) if forwards else None,
        "alpha": round(sum(r["accepted"] for r in records) / drafted, 4) if drafted else None,
        "draft_share": round(sum(r["draft_time"] for r in records) / seconds, 4) if seconds else None,
        "verify_share": round(sum(r["verify_time"] for r in records) / seconds, 4) if seconds else None,
        "lossless": None if sampled else all(r["lossless"] for r in rows),
        "identical": None if sampled else sum(r["identical"] for r in rows),
        "ties": [
            {"id": r["id"], "position": r["first_diff"], "gap": r["gap"]}
            for r in rows
            if r["lossless"] and not r["identical"] and r["gap"] is not None
        ],
        "failures": [{"id": r["id"], "reason": r["reason"]} for r in rows if r["lossless"] is False],
    }


def row_verdict(target, prompt, batched_ref, alone_ref, tokens, tie_tol) -> dict:
    """A row's losslessness: against batched ``ar``'s row, and (``alone_ref`` not None) against ``ar`` on the row
    alone. Lossless if it is lossless against either (both are plain greedy ``generate`` of that row); ``identical``
    and ``first_diff`` / ``gap`` / ``reason`` are against batched ``ar`` unless only the row-alone check passed."""
    v = compare_outputs(target, prompt, batched_ref, tokens, tie_tol)
    rec = {"identical": v.identical, "lossless": v.lossless, "first_diff": v.first_diff, "gap": v.gap}
    rec["reason"] = v.reason
    if alone_ref is None:
        return rec
    va = compare_outputs(target, prompt, alone_ref, tokens, tie_tol)
    rec.update(row_alone_identical=va.identical, row_alone_lossless=va.lossless)
    if not v.lossless:
        if va.lossless:
            rec.update(lossless=True, first_diff=va.first_diff, gap=va.gap)
            rec["reason"] = (
                f"equals ar on the row alone ({va.reason or 'identical'}); vs batched ar: {v.reason}"
            )
        else:
            rec["reason"] = f"vs batched ar: {v.reason}; vs ar on the row alone: {va.reason}"
    return rec
