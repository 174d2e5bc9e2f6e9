"""``hf-specdec bench``'s outputs: ``results.json``, ``report.md`` (the table of every (task, method)) and
``speedup.png``."""

from __future__ import annotations

import json
from pathlib import Path

from ..extras import require_extra
from ..machine import machine_line


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
        f"batch size {cfg.get('batch_size', 1)}, torch threads {cfg['torch_threads']}, tie tolerance {cfg['tie_tol']}, "
        f"{cfg.get('decoding', 'greedy')}",
        "",
        f"machine: {machine_line(cfg['machine_info'])}" if cfg.get("machine_info") else "",
        "",
    ]
    batched = cfg.get("batch_size", 1) > 1
    stock = any("speedup_vs_stock" in r for r in results["runs"])
    if batched:
        lines += [
            "| task | method | batched | speedup | tokens/s | tau | alpha | draft share | verify share | lossless "
            "| = `ar` on the row alone |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
    elif stock:
        lines += [
            "| task | method | speedup | vs `ar-stock` | tokens/s | tau | alpha | draft share | verify share "
            "| lossless |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    else:
        lines += [
            "| task | method | speedup | tokens/s | tau | alpha | draft share | verify share | lossless |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
    for r in results["runs"]:
        lossless = ("n/a (sampled)" if r["lossless"] is None else "yes" if r["lossless"] else "**NO**") + (
            f" ({len(r['ties'])} near-ties)" if r["ties"] else ""
        )
        figures = (
            f"{_fmt(r['speedup'])}x | {_fmt(r['tokens_per_s'], '{:.1f}')} | {_fmt(r['tau'])} | "
            f"{_fmt(r['alpha'])} | {_fmt(r['draft_share'])} | {_fmt(r['verify_share'])} | {lossless} |"
        )
        if batched:
            mode = "yes" if r["batched"] else "no: rows one at a time"
            alone = (
                "-" if r["row_alone_identical"] is None else f"{r['row_alone_identical']}/{r['n_prompts']}"
            )
            lines.append(f"| {r['task']} | {r['method']} | {mode} | {figures} {alone} |")
        elif stock:
            versus = _fmt(r.get("speedup_vs_stock"))
            lines.append(
                f"| {r['task']} | {r['method']} | {_fmt(r['speedup'])}x | {versus}x | "
                + figures.split(" | ", 1)[1]
            )
        else:
            lines.append(f"| {r['task']} | {r['method']} | {figures}")
    lines += [
        "",
        (
            "kernels: "
            + cfg["kernels"]
            + " (every model of the run; `ar-stock`: plain generate of a copy of the "
            "target on stock kernels)"
            if stock
            else ""
        ),
        "",
        "speedup = tokens/s over `ar` in the same run; tau = tokens per target forward (bonus token counted); "
        "alpha = accepted / drafted tokens; shares are of wall time (draft share = all time outside target forwards).",
        "",
    ]
    if results.get("first_call_speedup"):
        firsts = ", ".join(f"`{m}` {v:.2f}x" for m, v in results["first_call_speedup"].items())
        lines += [
            f"First calls (--cold: each method's first generation in this process, over `ar`'s): {firsts}",
            "",
        ]
    split = [r for r in results["runs"] if r.get("split")]
    if split:
        unit = next((r["split"].get("one_token_forward_ms") for r in split if r["method"] == "ar"), None)
        lines += [
            "Per step (one target forward call): time in target forwards, in drafter forwards and outside any "
            f"forward (overhead), in ms and in one-token forwards of `ar` in this run ({_fmt(unit)} ms); host syncs "
            "per step (device-to-host reads outside forwards) from one untimed generation per task.",
            "",
            "| task | method | speedup | tau | target ms (fwd) | drafter ms (fwd) | overhead ms (fwd) | host syncs/step |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in split:
            s = r["split"]
            cells = [
                f"{_fmt(s.get(f'{part}_ms'), '{:.1f}')} ({_fmt(s.get(f'{part}_fwd'), '{:.3f}')})"
                for part in ("target", "drafter", "overhead")
            ]
            lines.append(
                f"| {r['task']} | {r['method']} | {_fmt(r['speedup'])}x | {_fmt(r['tau'])} | "
                + " | ".join(cells)
                + f" | {_fmt(s.get('syncs_per_step'), '{:.1f}')} |"
            )
        lines.append("")
    if batched:
        b = cfg["batch_size"]
        lines += [
            f"Batches of {b} prompts (the last of a task may be smaller), left-padded; tokens/s counts every row; "
            f"`ar` is plain batched `generate` at batch {b}, the reference of speedup and of lossless. tau counts "
            "target forwards per row (a forward over r active rows counts r). batched = no: the method ran each row "
            "alone, one after the other, timed as the whole batch (transformers refuses a batch for assisted "
            "generation: `hf-pld`, `glide`, `edd`, ...). lossless: each row equals batched `ar`'s row or `ar` on the row alone (both plain greedy "
            "`generate`); the last column counts the rows identical to `ar` on the row alone.",
            "",
        ]
        if cfg.get("check_rows"):
            lines += [
                "batched `ar` == `ar` on the row alone: "
                + ", ".join(
                    f"{r['task']} {r['row_alone_identical']}/{r['n_prompts']} rows"
                    for r in results["runs"]
                    if r["method"] == "ar"
                ),
                "",
            ]
    if results.get("drafter_cost"):
        costs = ", ".join(f"`{m}` {c:.3f}" for m, c in results["drafter_cost"].items())
        lines += [
            f"drafter cost c (one draft forward / one target forward, timed here, {cfg['dtype']}): {costs}",
            "",
        ]
    sizing = results.get("sizing_costs") or {}
    if sizing.get("verify_curve") or sizing.get("drafter_c"):
        curves = "; ".join(
            f"{model} ({setting}) " + ", ".join(f"c({q}) {c:.2f}" for q, c in curve.items() if q != "1")
            for model, by_setting in sizing.get("verify_curve", {}).items()
            for setting, curve in by_setting.items()
        )
        drafters = ", ".join(
            f"`{m}` {c:.3f}"
            for m, by_setting in sizing.get("drafter_c", {}).items()
            for c in by_setting.values()
        )
        lines += [
            "costs the drafts were sized by (measured by the first generation that needed them, or read from the cost "
            "store, $HF_SPECDEC_HOME/costs.json; "
            f"verification forward of q tokens / one-token forward): {curves or '-'}; drafter c_d: {drafters or '-'}",
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
    require_extra("bench", "matplotlib", need="the bench's speedup figure")
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
    batch = results["config"].get("batch_size", 1)
    ax.set_title(
        f"hf-specdec bench ({results['config']['dtype']}, {results['config']['limit']} prompts/task"
        + (f", batch {batch})" if batch > 1 else ")")
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
