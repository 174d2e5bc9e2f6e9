"""``hf-specdec bench``: methods interleaved per prompt in one process, so machine drift hits all alike.

For every (method, task) it records walltime speedup over ``ar``, tokens/s, tau, alpha, draft and
verify time shares and losslessness against ``ar``'s output (see ``core/lossless.py``), and writes
``results.json`` (top-level ``runs``), ``report.md`` and ``speedup.png``.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..core.lossless import DEFAULT_TIE_TOL, compare_outputs
from ..core.stats import DecodeStats, ForwardMeter
from ..core.timing import clock
from ..errors import SpecDecError
from ..machine import describe_machine, machine_line, resolve_auto_dtype
from ..target import load_target, resolve_dtype
from ..tasks import load_task
from .methods import BenchContext, get_method

REFERENCE = "ar"


def _run_one(method, model, input_ids: torch.Tensor, max_new_tokens: int) -> tuple[list[int], DecodeStats]:
    with ForwardMeter(model) as meter:
        t0 = clock(meter.device)
        tokens, stats = method.generate(input_ids, max_new_tokens)
        elapsed = clock(meter.device) - t0
    tokens = [int(t) for t in tokens]
    if stats is None:
        stats = meter.chain_stats(input_ids.shape[1], len(tokens), elapsed)
    stats.new_tokens, stats.total_time = len(tokens), elapsed
    if not stats.target_forwards:
        stats.target_forwards, stats.verify_time = meter.calls, meter.time
    return tokens, stats


def _aggregate(method: str, task: str, records: list[dict], ref_tps: float | None) -> dict:
    tokens = sum(r["new_tokens"] for r in records)
    seconds = sum(r["total_time"] for r in records)
    forwards = sum(r["target_forwards"] for r in records)
    drafted = sum(r["drafted"] for r in records)
    tps = tokens / seconds if seconds else 0.0
    return {
        "method": method,
        "task": task,
        "n_prompts": len(records),
        "new_tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tps, 3),
        "speedup": round(tps / ref_tps, 4) if ref_tps else None,
        "tau": round(tokens / forwards, 4) if forwards else None,
        "alpha": round(sum(r["accepted"] for r in records) / drafted, 4) if drafted else None,
        "draft_share": round(sum(r["draft_time"] for r in records) / seconds, 4) if seconds else None,
        "verify_share": round(sum(r["verify_time"] for r in records) / seconds, 4) if seconds else None,
        "lossless": all(r["lossless"] for r in records),
        "identical": sum(r["identical"] for r in records),
        "ties": [
            {"id": r["id"], "position": r["first_diff"], "gap": r["gap"]}
            for r in records
            if r["lossless"] and not r["identical"]
        ],
        "failures": [{"id": r["id"], "reason": r["reason"]} for r in records if not r["lossless"]],
    }


def run_bench(
    methods: list[str],
    tasks: list[str],
    limit: int = 10,
    max_new_tokens: int = 128,
    dtype: str = "fp32",
    out: str | Path = "bench-out",
    model: str | None = None,
    gguf_file: str | None = None,
    tie_tol: float | None = None,
    options: dict | None = None,
    command: str | None = None,
) -> dict:
    """Run the benchmark and write its outputs under ``out``; returns the results dict."""
    if limit < 1:
        raise SpecDecError(f"--limit must be at least 1 (got {limit})")
    if max_new_tokens < 1:
        raise SpecDecError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    requested_dtype, dtype = dtype, resolve_auto_dtype(dtype)  # the machine decides "auto" (fp32 or bf16)
    names = [REFERENCE] + [m for m in dict.fromkeys(methods) if m != REFERENCE]
    classes = [get_method(n) for n in names]  # unknown names fail here, before any loading
    datasets = {t: load_task(t, None, limit) for t in tasks}  # unknown tasks / missing packages fail early
    target, tokenizer = load_target(model, dtype, gguf_file=gguf_file)
    torch_dtype = resolve_dtype(dtype)
    tie_tol = DEFAULT_TIE_TOL.get(torch_dtype) if tie_tol is None else tie_tol
    ctx = BenchContext(target, tokenizer, dtype, options or {})
    runners = {}
    for name, cls in zip(names, classes):
        runner = cls()
        runner.setup(ctx)
        runners[name] = runner

    datasets = {t: load_task(t, tokenizer, limit) for t in tasks}
    total = sum(len(d) for d in datasets.values())
    # Warm-up: one short generation per method so lazy initialisation is not timed.
    warm = tokenizer(next(iter(datasets.values()))[0]["prompt"], return_tensors="pt").input_ids
    for runner in runners.values():
        runner.generate(warm, 8)
    drafter_costs = measure_drafter_costs(runners, target)

    records: dict[tuple[str, str], list[dict]] = {(m, t): [] for m in names for t in tasks}
    bar = tqdm(total=total, desc="bench prompts", unit="prompt")
    for task, ds in datasets.items():
        for i, row in enumerate(ds):
            input_ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(target.device)
            order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
            outputs = {}
            for name in order:
                outputs[name] = _run_one(runners[name], target, input_ids, max_new_tokens)
            reference = outputs[REFERENCE][0]
            for name in names:
                tokens, stats = outputs[name]
                verdict = compare_outputs(target, input_ids, reference, tokens, tie_tol)
                records[(name, task)].append(
                    {
                        "id": row["id"],
                        **stats.to_dict(),
                        "identical": verdict.identical,
                        "lossless": verdict.lossless,
                        "first_diff": verdict.first_diff,
                        "gap": verdict.gap,
                        "reason": verdict.reason,
                    }
                )
            bar.update(1)
    bar.close()

    runs = []
    for task in tasks:
        ref = _aggregate(REFERENCE, task, records[(REFERENCE, task)], None)
        for name in names:
            runs.append(_aggregate(name, task, records[(name, task)], ref["tokens_per_s"]))
    results = {
        "command": command or "",
        "config": {
            "model": model or "default (SmolLM2-135M-Instruct)",
            **({"gguf_file": gguf_file} if gguf_file else {}),
            "dtype": dtype,
            "dtype_requested": requested_dtype,
            "limit": limit,
            "max_new_tokens": max_new_tokens,
            "tie_tol": tie_tol,
            "methods": names,
            "tasks": tasks,
            "torch_threads": torch.get_num_threads(),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "machine_info": describe_machine(target.device),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
        "runs": runs,
        "drafter_cost": drafter_costs,
        "per_prompt": {f"{m}/{t}": r for (m, t), r in records.items()},
    }
    write_outputs(results, Path(out))
    return results


def measure_drafter_costs(runners: dict, target) -> dict[str, float]:
    """c per drafter method (``core.drafter_cost``): one draft forward over one target forward, timed here; a
    drafter shared by several methods is timed once."""
    from ..core.drafter_cost import drafter_cost

    timed: dict[int, float] = {}
    costs = {}
    for name, runner in runners.items():
        if runner.drafter is not None:
            key = id(runner.drafter)
            if key not in timed:
                timed[key] = drafter_cost(runner.drafter, target)
            costs[name] = round(timed[key], 4)
    return costs


def _fmt(v, pattern="{:.2f}") -> str:
    return "-" if v is None else pattern.format(v)


def report_markdown(results: dict) -> str:
    cfg = results["config"]
    lines = [
        "# hf-specdec bench",
        "",
        f"`{results['command']}`" if results.get("command") else "",
        "",
        f"model: {cfg['model']}, dtype {cfg['dtype']}, {cfg['limit']} prompts per task, max_new_tokens {cfg['max_new_tokens']}, "
        f"torch threads {cfg['torch_threads']}, tie tolerance {cfg['tie_tol']}",
        "",
        f"machine: {machine_line(cfg['machine_info'])}" if cfg.get("machine_info") else "",
        "",
        "| task | method | speedup | tokens/s | tau | alpha | draft share | verify share | lossless |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results["runs"]:
        lossless = ("yes" if r["lossless"] else "**NO**") + (
            f" ({len(r['ties'])} near-ties)" if r["ties"] else ""
        )
        lines.append(
            f"| {r['task']} | {r['method']} | {_fmt(r['speedup'])}x | {_fmt(r['tokens_per_s'], '{:.1f}')} | {_fmt(r['tau'])} | "
            f"{_fmt(r['alpha'])} | {_fmt(r['draft_share'])} | {_fmt(r['verify_share'])} | {lossless} |"
        )
    lines += [
        "",
        "speedup = tokens/s over `ar` in the same run; tau = tokens per target forward (bonus token counted); "
        "alpha = accepted / drafted tokens; shares are of wall time (draft share = all time outside target forwards).",
        "",
    ]
    if results.get("drafter_cost"):
        costs = ", ".join(f"`{m}` {c:.3f}" for m, c in results["drafter_cost"].items())
        lines += [
            f"drafter cost c (one draft forward / one target forward, timed here, {cfg['dtype']}): {costs}",
            "",
        ]
    failures = [(r["method"], r["task"], f) for r in results["runs"] for f in r["failures"]]
    if failures:
        lines += (
            ["## Not lossless", ""]
            + [f"- {m} on {t}, {f['id']}: {f['reason']}" for m, t, f in failures]
            + [""]
        )
    return "\n".join(lines)


def plot_speedup(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = results["config"]["tasks"]
    methods = results["config"]["methods"]
    by = {(r["method"], r["task"]): r["speedup"] or 0.0 for r in results["runs"]}
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(tasks), 4))
    for k, m in enumerate(methods):
        xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(tasks))]
        bars = ax.bar(xs, [by[(m, t)] for t in tasks], width, label=m)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("speedup over plain generate (x)")
    ax.set_title(
        f"hf-specdec bench ({results['config']['dtype']}, {results['config']['limit']} prompts/task)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(report_markdown(results))
    plot_speedup(results, out / "speedup.png")
