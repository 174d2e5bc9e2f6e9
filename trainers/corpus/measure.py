"""How fast each method and batch size regenerates (``hf-specdec corpus --regenerate --measure METHOD:B,...``).

:func:`measure` times ``regenerate.py``'s batched answering on the first user turns of the first bench-filtered train
conversations, greedy, batches sorted by length as in a shard, so the default ``--method`` / ``--batch-size`` can be
chosen on the machine at hand. :func:`measure_shards` (``--measure-shards``) times whole shards of a run in ``--out``
with the run's own settings, every configuration on a shard before the next shard, and checks that each wrote the
shard's committed text (docs/corpus.md has the figures).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hf_specdec.errors import SpecDecError

from .bench_overlap import BenchFilter, bench_texts, clean_items
from .regenerate import answer_batch, answer_prompts, generate_kwargs, prompt_ids, regenerate_conversations
from .store import read_shard, shard_files


def measure(
    model,
    tokenizer,
    configs: list[tuple[str, int]],
    prompts: int = 16,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 1024,
) -> list[dict]:
    """Generated tokens per second of each ``(method, batch size)`` on the first user turns of ``prompts`` train
    conversations (bench-filtered, within ``max_prompt_tokens``), greedy, batches sorted by length as in a shard."""
    from hf_specdec.core.generate_io import eos_token_ids
    from hf_specdec.machine import describe_machine, machine_line

    tokenizer.padding_side = "left"
    bench = BenchFilter(bench_texts())
    chosen = []
    for _, messages in clean_items("train", bench):
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        ids = prompt_ids(tokenizer, [m for m in messages[: first + 1] if m["role"] != "assistant"])
        if len(ids) <= max_prompt_tokens:
            chosen.append(ids)
        if len(chosen) == prompts:
            break
    chosen.sort(key=len)
    eos = set(eos_token_ids(model.generation_config))
    print(f"machine: {machine_line(describe_machine())}; dtype {next(model.parameters()).dtype}")
    results = []
    for method, batch_size in configs:
        kwargs = generate_kwargs(method, {"mode": "greedy"})
        answer_batch(
            model, tokenizer, chosen[:batch_size], 8, kwargs
        )  # warm-up (PLD+ measures its cost curve)
        t0 = time.perf_counter()
        tokens = finished = 0
        for row in answer_prompts(model, tokenizer, chosen, max_new_tokens, method, kwargs, batch_size):
            finished += bool(row) and row[-1] in eos
            tokens += len(row) - (bool(row) and row[-1] in eos)
        seconds = time.perf_counter() - t0
        r = {
            "method": method,
            "batch_size": batch_size,
            "prompts": len(chosen),
            "tokens": tokens,
            "finished": finished,
            "seconds": round(seconds, 1),
            "tokens_per_s": round(tokens / seconds, 2),
        }
        results.append(r)
        print(json.dumps(r))
    return results


def measure_shards(
    model,
    tokenizer,
    out: str | Path,
    split: str,
    shards: list[int],
    configs: list[tuple[str, int]],
    dtype: str,
) -> list[dict]:
    """Seconds and tokens/s of each ``(method, batch size)`` on whole shards ``shards`` of the run in ``out``, with
    that run's settings (``regenerate.json``: turns, token limits, generation, shard size), in one process: on each
    shard every configuration in turn (after a short warm-up of each), so a slow spell of the machine falls on all
    of them. Each row says whether the configuration wrote the shard's finished file, record for record."""
    from hf_specdec.machine import describe_machine, machine_line

    out = Path(out)
    path = out / "regenerate.json"
    if not path.is_file():
        raise SpecDecError(f"--measure-shards: {path} not found; --out must be a regeneration run's folder")
    meta = json.loads(path.read_text())
    if meta["dtype"] != dtype:
        raise SpecDecError(
            f"--measure-shards: the run in {out} is {meta['dtype']}; pass --dtype {meta['dtype']}"
        )
    settings = {k: meta[k] for k in ("max_new_tokens", "max_turns", "max_prompt_tokens", "generation")}
    if settings["generation"]["mode"] != "greedy" and any(m == "ar-refill" for m, _ in configs):
        raise SpecDecError("--measure-shards: this run samples, and --method ar-refill decodes greedy only")
    items = list(clean_items(split, BenchFilter(bench_texts())))
    size = meta["shard_size"]
    last = (len(items) + size - 1) // size - 1
    if not shards or any(not 0 <= s <= last for s in shards):
        raise SpecDecError(f"--measure-shards {shards}: {split} has shards 0 to {last}")
    files = {p.name.split(".")[0]: p for p in shard_files(out, split)}
    print(f"machine: {machine_line(describe_machine())}; dtype {dtype}; {out} {split} shards {shards}")
    for method, batch_size in configs:  # warm-up
        warm = {**settings, "method": method, "batch_size": batch_size, "max_new_tokens": 4}
        regenerate_conversations(model, tokenizer, items[:2], warm, split, seed_key=("warm-up",))
    rows, totals = [], {c: [0.0, 0] for c in configs}
    for s in shards:
        finished = files.get(f"{split}-{s:05d}")
        committed = read_shard(finished) if finished else None
        for method, batch_size in configs:
            run = {**settings, "method": method, "batch_size": batch_size}
            t0 = time.perf_counter()
            records = regenerate_conversations(
                model, tokenizer, items[s * size : (s + 1) * size], run, split, seed_key=(split, s)
            )
            seconds = time.perf_counter() - t0
            tokens = sum(sum(r["answer_tokens"]) for r in records)
            totals[(method, batch_size)][0] += seconds
            totals[(method, batch_size)][1] += tokens
            row = {
                "shard": s,
                "method": method,
                "batch_size": batch_size,
                "tokens": tokens,
                "seconds": round(seconds, 1),
                "tokens_per_s": round(tokens / seconds, 2),
                "same_as_shard_file": None if committed is None else records == committed,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    for (method, batch_size), (seconds, tokens) in totals.items():
        total = {"shards": shards, "method": method, "batch_size": batch_size, "tokens": tokens}
        total |= {"seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 2)}
        rows.append(total)
        print(json.dumps(total))
    return rows
