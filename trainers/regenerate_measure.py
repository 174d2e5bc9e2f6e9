"""How fast each method and batch size regenerates (``hf-specdec corpus --regenerate --measure METHOD:B,...``).

Times ``regenerate.py``'s batched answering on the first user turns of the first bench-filtered train conversations,
greedy, batches sorted by length as in a shard, so the default ``--method`` / ``--batch-size`` can be chosen on the
machine at hand (docs/corpus.md has the figures).
"""

from __future__ import annotations

import json
import time

from .bench_overlap import BenchFilter, bench_texts, clean_items
from .regenerate import answer_batch, answer_prompts, generate_kwargs, prompt_ids


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
