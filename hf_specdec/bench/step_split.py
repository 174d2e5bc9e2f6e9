"""The bench's per-step split (issue #31): where a step's time goes (target forwards, drafter forwards, overhead),
in ms and in one-token forwards of the same run, and the host syncs per step of the untimed counting pass. The meters
that fill the records are ``core/stats.ForwardMeter`` / ``DrafterMeter`` and ``core/host_syncs.HostSyncCounter``
(through ``methods.metered`` / ``run_row``); ``docs/step-overhead.md`` explains the table."""

from __future__ import annotations


def one_token_forward(records: list[dict]) -> float | None:
    """The median one-token target forward of ``ar``'s ``records`` (seconds): the unit of the per-step split."""
    times = sorted(r["one_token_forward"] for r in records if r.get("one_token_forward"))
    return times[len(times) // 2] if times else None


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
