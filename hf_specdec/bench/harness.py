"""``hf-specdec bench``: methods interleaved per prompt (or batch) in one process, so machine drift hits all alike.

For every (method, task) it records walltime speedup over ``ar``, tokens/s, tau, alpha, draft and verify time
shares and losslessness against ``ar``'s output (``core/lossless.py``); ``report.py`` writes the outputs. A method
that decodes a model of its own (``space`` on a target that is not a SAR-SFT model) is judged against plain
``generate`` of that model instead, its speedup still over ``ar`` (``own_models.py``)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from ..core.batch_io import left_pad, pad_token_id
from ..core.lossless import DEFAULT_TIE_TOL
from ..core.stats import DecodeStats
from ..core.timing import clock
from ..errors import SpecDecError
from ..kernels import KERNELS
from ..machine import describe_machine, resolve_auto_dtype
from ..space.adapter import load_model
from ..target import resolve_dtype
from ..tasks import load_task
from .figures import (
    aggregate,
    measure_drafter_costs,
    one_token_forward,
    row_verdict,
    sizing_costs,
    step_split,
)
from .kernel_runs import STOCK, add_stock_speedups, apply_run_kernels, first_call_speedups
from .method_options import check_read, option_strings
from .methods import BenchContext, get_method, metered, run_row, sampling
from .own_models import OwnModels, setup_runners
from .report import write_outputs

REFERENCE = "ar"
# the verdict of a sampled generation: not compared with ar's (a sample); the distribution tests check sampling
SAMPLED = SimpleNamespace(identical=None, lossless=None, first_diff=None, gap=None, reason="sampled")


def _run_one(
    method, model, input_ids: torch.Tensor, max_new_tokens: int, count_syncs: bool = False
) -> tuple[list[int], DecodeStats]:
    return run_row(method, model, input_ids, max_new_tokens, count_syncs)


def _run_batch(
    method, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int
) -> tuple[list[list[int]], DecodeStats, int]:
    """One timed batch: ``generate_batch`` if the method batches, else its rows one at a time (``generate_rows``).
    Returns the rows' new tokens, the batch's stats (``target_forwards`` per row, see ``Method.generate_batch``; a
    method that returns none gets the rows of every forward, an upper bound when finished rows ride along) and the
    number of actual forwards of the target."""
    generate = method.generate_batch if method.batchable else method.generate_rows
    with metered(method, model) as (meter, drafter_meter):
        t0 = clock(meter.device)
        rows, stats = generate(input_ids, attention_mask, max_new_tokens)
        elapsed = clock(meter.device) - t0
    rows = [[int(t) for t in row] for row in rows]
    stats = DecodeStats() if stats is None else stats
    meter.split(stats, drafter_meter)
    stats.new_tokens, stats.total_time = sum(len(r) for r in rows), elapsed
    if not stats.target_forwards:
        stats.target_forwards = sum(meter.batch_sizes)
    if not stats.verify_time:
        stats.verify_time, stats.draft_time = meter.time, elapsed - meter.time
    return rows, stats, getattr(stats, "batched_forwards", 0) or meter.calls


def batches(items: list, size: int) -> list[list]:
    """``items`` in consecutive groups of ``size`` (the last one may be smaller)."""
    return [items[i : i + size] for i in range(0, len(items), size)]


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
    batch_size: int = 1,
    check_rows: bool | None = None,
    temperature: float | None = None,
    seed: int = 0,
    kernels: str = "stock",
    cold: bool = False,
) -> dict:
    """Run the benchmark and write its outputs under ``out``; returns the results dict.

    ``batch_size`` B > 1: each task's prompts go in batches of B (the last may be smaller), left-padded; every
    method decodes each batch in one call (``Method.generate_batch``) or, if it does not batch, its rows one at a
    time; tokens/s counts all rows and the reference is batched ``ar`` at the same B. ``check_rows`` (default: on
    when B > 1) also runs ``ar`` on every row alone, untimed, and compares each method's rows with it too.
    ``temperature`` T: every method samples at T (batch 1; each generation seeded with ``seed`` + prompt index):
    speed and tau under sampling; its losslessness is the distribution tests' (``lossless`` is ``None`` here).
    ``kernels``: what every model of the run (target, drafters, a method's own model) runs
    (``hf_specdec.apply_kernels``); other than ``"stock"``, the run also times ``ar-stock`` (:data:`STOCK`), plain
    ``generate`` of a second copy of the target on stock kernels, and reports each method's ``speedup_vs_stock``.
    ``cold``: no warm-up generation (one plain forward only), so the first prompt times each method's first call.
    """
    if limit < 1:
        raise SpecDecError(f"--limit must be at least 1 (got {limit})")
    if batch_size < 1:
        raise SpecDecError(f"--batch-size must be at least 1 (got {batch_size})")
    if cold and batch_size > 1:
        raise SpecDecError("--cold runs at --batch-size 1 (each method's first call is one prompt)")
    if temperature and batch_size > 1:
        raise SpecDecError("--temperature runs at --batch-size 1 (one seeded sample per prompt and method)")
    check_rows = batch_size > 1 if check_rows is None else bool(check_rows) and batch_size > 1
    if max_new_tokens < 1:
        raise SpecDecError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    requested_dtype, dtype = dtype, resolve_auto_dtype(dtype)  # the machine decides "auto" (fp32 or bf16)
    if kernels not in KERNELS:
        raise SpecDecError(f"--kernels {kernels}: expected one of {', '.join(KERNELS)}")
    names = [REFERENCE] + [m for m in dict.fromkeys(methods) if m not in (REFERENCE, STOCK)]
    if kernels != "stock":
        names.insert(1, STOCK)
    classes = [get_method(n) for n in names]  # unknown names fail here, before any loading
    datasets = {t: load_task(t, None, limit) for t in tasks}  # unknown tasks / missing packages fail early
    target, tokenizer = load_model(model, dtype, gguf_file=gguf_file)
    torch_dtype = resolve_dtype(dtype)
    tie_tol = DEFAULT_TIE_TOL.get(torch_dtype) if tie_tol is None else tie_tol
    ctx = BenchContext(target, tokenizer, dtype, option_strings(options), model_name=model)
    runners = setup_runners(names, classes, ctx)  # a method --model cannot serve fails here
    kernel_reports = {}
    if kernels != "stock":
        runners[STOCK].model = load_model(model, dtype, gguf_file=gguf_file)[0]  # the stock copy it times
        kernel_reports = apply_run_kernels(runners, target, kernels)
    own = OwnModels(runners, target, ctx)

    datasets = {t: load_task(t, tokenizer, limit) for t in tasks}
    # Warm-up: one short generation per method so lazy initialisation is not timed.
    warm = tokenizer(next(iter(datasets.values()))[0]["prompt"], return_tensors="pt").input_ids
    warm = warm.to(target.device)
    if cold:
        with torch.no_grad():
            target(warm)
    else:
        for runner in runners.values():
            runner.generate(warm, 8)
    if not cold:  # cold: the first calls come first; options are checked and drafter costs timed after them
        check_read(
            ctx.options, names
        )  # every option was asked for, by setup or the warm-up, before any timing
        drafter_costs = measure_drafter_costs(runners, target)

    if batch_size > 1:
        runs, per_prompt, per_batch = _bench_batches(
            runners, names, datasets, target, tokenizer, max_new_tokens, tie_tol, batch_size, check_rows, own
        )
    else:
        with sampling(temperature):
            runs, per_prompt = _bench_prompts(
                runners,
                names,
                datasets,
                target,
                tokenizer,
                max_new_tokens,
                tie_tol,
                own,
                temperature and seed,
            )
    if cold:
        check_read(ctx.options, names)
        drafter_costs = measure_drafter_costs(runners, target)
    first_calls = first_call_speedups(per_prompt, names, tasks[0]) if cold else None
    results = {
        "command": command or "",
        "config": {
            "model": own.model_line(model or "default (SmolLM2-135M-Instruct)"),
            **({"own_models": own.sources} if own.sources else {}),
            **({"gguf_file": gguf_file} if gguf_file else {}),
            "dtype": dtype,
            "dtype_requested": requested_dtype,
            "kernels": kernels,
            "cold": cold,
            **({"kernel_reports": kernel_reports} if kernel_reports else {}),
            "limit": limit,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "decoding": f"sampling, temperature {temperature}, seed {seed}" if temperature else "greedy",
            **({"check_rows": check_rows} if batch_size > 1 else {}),
            "tie_tol": tie_tol,
            "methods": names,
            "tasks": tasks,
            "torch_threads": torch.get_num_threads(),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "machine_info": describe_machine(target.device),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
        "runs": add_stock_speedups(runs),
        "drafter_cost": drafter_costs,
        "sizing_costs": sizing_costs(runners, target),
        **({"first_call_speedup": first_calls} if cold else {}),
        "per_prompt": per_prompt,
        **({"per_batch": per_batch} if batch_size > 1 else {}),
    }
    write_outputs(results, Path(out))
    return results


def _bench_prompts(runners, names, datasets, target, tokenizer, max_new_tokens, tie_tol, own, seed=None):
    """Batch 1: every prompt through every method, the order rotating per prompt. ``seed`` (sampling): each method's
    generation of prompt ``i`` starts from ``torch.manual_seed(seed + i)``, and nothing is compared with ``ar``."""
    tasks = list(datasets)
    total = sum(len(d) for d in datasets.values())
    records: dict[tuple[str, str], list[dict]] = {(m, t): [] for m in names for t in tasks}
    syncs: dict[tuple[str, str], list[tuple[int, int]]] = {(m, t): [] for m in names for t in tasks}
    bar = tqdm(total=total, desc="bench prompts", unit="prompt")
    for task, ds in datasets.items():
        for i, row in enumerate(ds):
            input_ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(target.device)
            order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
            outputs = {}
            for name in order:
                if seed is not None:
                    torch.manual_seed(seed + i)
                outputs[name] = _run_one(runners[name], runners[name].model, input_ids, max_new_tokens)
            if i == 0:  # untimed: count the host syncs of each method on the task's first prompt
                for name in names:
                    _, counted = _run_one(runners[name], runners[name].model, input_ids, max_new_tokens, True)
                    syncs[(name, task)].append((counted.host_syncs, counted.forwards))
            reference = outputs[REFERENCE][0]
            for name in names:
                tokens, stats = outputs[name]
                verdict = (
                    SAMPLED
                    if seed is not None
                    else own.verdict(name, input_ids, reference, tokens, max_new_tokens, tie_tol)
                )
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
        ref = aggregate(REFERENCE, task, records[(REFERENCE, task)], None)
        unit = one_token_forward(records[(REFERENCE, task)])
        for name in names:
            run = aggregate(name, task, records[(name, task)], ref["tokens_per_s"])
            run["split"] = step_split(records[(name, task)], unit, syncs[(name, task)])
            runs.append(run)
    return runs, {f"{m}/{t}": r for (m, t), r in records.items()}


def _bench_batches(
    runners, names, datasets, target, tokenizer, max_new_tokens, tie_tol, batch_size, check_rows, own
):
    """Batch B > 1: each task's prompts in batches of B, every batch through every method (the order rotating per
    batch), timed as one call; each row checked against batched ``ar`` (and ``ar`` on the row alone)."""
    tasks = list(datasets)
    pad_id = pad_token_id(tokenizer)
    grouped = {t: batches(list(ds), batch_size) for t, ds in datasets.items()}
    rows_of: dict[tuple[str, str], list[dict]] = {(m, t): [] for m in names for t in tasks}
    batches_of: dict[tuple[str, str], list[dict]] = {(m, t): [] for m in names for t in tasks}
    # Warm-up of the batched path too (a batched loop may set itself up on its first batch).
    first = grouped[tasks[0]][0]
    warm_ids, warm_mask = left_pad([tokenizer(r["prompt"]).input_ids for r in first], pad_id)
    for runner in runners.values():
        generate = runner.generate_batch if runner.batchable else runner.generate_rows
        generate(warm_ids.to(target.device), warm_mask.to(target.device), 8)
    bar = tqdm(
        total=sum(len(g) for g in grouped.values()), desc=f"bench batches of {batch_size}", unit="batch"
    )
    for task, groups in grouped.items():
        for b, group in enumerate(groups):
            prompts = [tokenizer(r["prompt"]).input_ids for r in group]  # each row as batch 1 tokenizes it
            input_ids, mask = left_pad(prompts, pad_id)
            input_ids, mask = input_ids.to(target.device), mask.to(target.device)
            order = names[b % len(names) :] + names[: b % len(names)]  # rotate who goes first
            outputs = {
                name: _run_batch(runners[name], runners[name].model, input_ids, mask, max_new_tokens)
                for name in order
            }
            alone = [None] * len(group)
            if check_rows:  # untimed: plain generate on each row alone, the reference
                alone = [
                    [
                        int(t)
                        for t in runners[REFERENCE].generate(
                            torch.tensor([p], device=target.device), max_new_tokens
                        )[0]
                    ]
                    for p in prompts
                ]
            reference = outputs[REFERENCE][0]
            for name in names:
                rows, stats, forwards = outputs[name]
                batches_of[(name, task)].append(
                    {
                        "batch": b,
                        "ids": [r["id"] for r in group],
                        "batched": runners[name].batchable,
                        **stats.to_dict(),
                        "batched_forwards": forwards,
                    }
                )
                for j, row in enumerate(group):
                    prompt = torch.tensor([prompts[j]], device=target.device)
                    if name in own:
                        rec = own.row_record(name, prompt, rows[j], max_new_tokens, tie_tol, check_rows)
                    else:
                        rec = row_verdict(target, prompt, reference[j], alone[j], rows[j], tie_tol)
                    rows_of[(name, task)].append(
                        {"id": row["id"], "batch": b, "new_tokens": len(rows[j]), **rec}
                    )
            bar.update(1)
    bar.close()

    runs = []
    for task in tasks:
        ref = aggregate(REFERENCE, task, batches_of[(REFERENCE, task)], None, rows_of[(REFERENCE, task)])
        for name in names:
            records, rows = batches_of[(name, task)], rows_of[(name, task)]
            run = aggregate(name, task, records, ref["tokens_per_s"], rows)
            run["split"] = step_split(records, one_token_forward(batches_of[(REFERENCE, task)]))
            run.update(
                batch_size=batch_size,
                batched=runners[name].batchable,
                batched_forwards=sum(r["batched_forwards"] for r in records),
                row_alone_identical=sum(r["row_alone_identical"] for r in rows) if check_rows else None,
            )
            runs.append(run)
    per_prompt = {f"{m}/{t}": r for (m, t), r in rows_of.items()}
    per_batch = {f"{m}/{t}": r for (m, t), r in batches_of.items()}
    return runs, per_prompt, per_batch
