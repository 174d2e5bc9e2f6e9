"""A regenerated corpus: the target answers ShareGPT's prompts itself (``hf-specdec corpus --regenerate``).

A drafter learns to predict its target; trained on ShareGPT's ChatGPT answers, it learns ChatGPT's text, not what
the target writes. Here every ShareGPT conversation keeps its system and user messages (the prompts) and gets the
target's own answers: for each user turn in order (``max_turns`` at most), the target answers the conversation so
far (the earlier user turns and its own earlier answers) with ``max_new_tokens`` at most, by greedy decoding or, with
``--sample``, by sampling at its generation config's temperature / top-k / top-p (transformers' defaults where the
config sets none). The original assistant messages are dropped. A conversation ends before the first turn whose
prompt would pass ``max_prompt_tokens`` (a conversation whose first prompt already does is left out).

Work is batched: a shard's conversations answer turn by turn, each turn's prompts sorted by length and decoded in
left-padded batches of ``batch_size`` by ``method`` (``ar``: plain ``generate``; ``pld-plus-h``:
``custom_generate=hf_specdec.pld_plus``, lossless), or by ``ar-refill`` (greedy only): up to ``batch_size`` rows at
once, a row leaving when it ends and the next prompts taking its place (continuous batching,
``refill.py``). In fp32 greedy the three write the same text; only the time differs (docs/corpus.md).
The train / validation split is ShareGPT's
(``hf_specdec.tasks.sharegpt_items``), so validation stays held out.

The rest lives next to this module: ``bench_overlap.py`` keeps every bench prompt out (conversations are dropped
before anything is generated), ``store.py`` writes the shards and ``regenerate.json`` (a rerun of the same
command resumes), ``dataset.py`` assembles the shards into the ``datasets`` dataset and the pre-tokenized
corpus, ``measure.py`` times methods and batch sizes (``--measure``), and ``command.py`` is the
command line. docs/corpus.md has the figures.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.tasks import render_plain

from .bench_overlap import BenchFilter, bench_texts, clean_items
from .dataset import finalize
from .store import (
    open_run,
    record_shard,
    regeneration_metadata,
    shard_done,
    shard_path,
    write_meta,
    write_shard,
)

METHODS = ("ar", "pld-plus-h", "ar-refill")
DEFAULT_METHOD = "ar"
DEFAULT_BATCH_SIZE = 32  # measured fastest here (docs/corpus.md): plain batched generate at B = 32


def generation_settings(model, sample: bool, seed: int) -> dict:
    """Greedy, or sampling at the target's generation config (transformers' defaults where it sets none)."""
    if not sample:
        return {"mode": "greedy"}
    from transformers import GenerationConfig

    defaults = GenerationConfig._get_default_generation_params()
    gc = model.generation_config
    values = {k: getattr(gc, k, None) for k in ("temperature", "top_k", "top_p")}
    return {"mode": "sample", **{k: defaults[k] if v is None else v for k, v in values.items()}, "seed": seed}


def generate_kwargs(method: str, generation: dict) -> dict:
    if method not in METHODS:
        raise SpecDecError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    kwargs: dict = {}
    if method == "ar-refill" and generation["mode"] != "greedy":
        raise SpecDecError("--method ar-refill decodes greedy only; with --sample use --method ar")
    if method == "pld-plus-h":
        from hf_specdec.pld_plus import pld_plus

        kwargs = {"custom_generate": pld_plus, "pld_variant": "hidden"}
    if generation["mode"] == "sample":
        kwargs.update(
            do_sample=True,
            temperature=generation["temperature"],
            top_k=generation["top_k"],
            top_p=generation["top_p"],
        )
    else:
        kwargs["do_sample"] = False
    return kwargs


def _seed(*parts) -> int:
    return int(hashlib.sha1(json.dumps(parts).encode()).hexdigest()[:8], 16)


@torch.no_grad()
def answer_batch(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int, kwargs: dict
) -> list[list[int]]:
    """The new tokens of each (token-id) prompt, decoded as one left-padded batch; each row ends with its EOS when it
    stopped on one."""
    from hf_specdec.core.batch_io import left_pad, pad_token_id, split_rows
    from hf_specdec.core.generate_io import eos_token_ids

    pad = pad_token_id(tokenizer)
    ids, mask = left_pad(prompts, pad)
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        **kwargs,
    )
    return split_rows(out.cpu(), ids.shape[1], eos_token_ids(model.generation_config))


def answer_prompts(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    method: str,
    kwargs: dict,
    batch_size: int,
) -> list[list[int]]:
    """The new tokens of each prompt (sorted by length for little padding), as :func:`answer_batch` gives them:
    ``ar-refill`` decodes them all in one refilled batch, the other methods batch by batch of ``batch_size``."""
    if method == "ar-refill":
        from hf_specdec.core.batch_io import pad_token_id
        from hf_specdec.core.generate_io import eos_token_ids

        from .refill import refill_greedy

        eos = eos_token_ids(model.generation_config)
        return refill_greedy(model, prompts, max_new_tokens, eos, pad_token_id(tokenizer), batch_size)
    rows = []
    for b in range(0, len(prompts), batch_size):
        rows += answer_batch(model, tokenizer, prompts[b : b + batch_size], max_new_tokens, kwargs)
    return rows


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = render_plain(messages, generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def regenerate_conversations(
    model, tokenizer, items: list[tuple[str, list[dict]]], settings: dict, split: str, seed_key=()
) -> list[dict]:
    """The target's conversations for ``items`` (``(id, ShareGPT messages)``), answered turn by turn in batches.
    Returns one record per conversation with at least one answer (the dataset's row)."""
    from hf_specdec.core.generate_io import eos_token_ids

    eos = set(eos_token_ids(model.generation_config))
    kwargs = generate_kwargs(settings["method"], settings["generation"])
    convs = []
    for cid, messages in items:
        kept = [m for m in messages if m["role"] in ("system", "user")]
        convs.append(
            {
                "conversation_id": cid,
                "source": f"sharegpt-v3/{split}",
                "pending": kept,  # the messages still to be fed, in order
                "messages": [],
                "answer_tokens": [],
                "answer_finished": [],
                "open": True,
            }
        )
    for turn in range(settings["max_turns"]):
        active = []
        for c in convs:
            if not c["open"]:
                continue
            # the system messages before the next user turn, then that user turn
            k = next((i for i, m in enumerate(c["pending"]) if m["role"] == "user"), None)
            if k is None:
                c["open"] = False
                continue
            context = c["messages"] + c["pending"][: k + 1]
            ids = prompt_ids(tokenizer, context)
            if len(ids) > settings["max_prompt_tokens"]:
                c["open"] = False
                continue
            active.append((len(ids), c, context, ids, k))
        if not active:
            break
        active.sort(key=lambda a: a[0])
        batch_size = settings["batch_size"]
        # sampling seeds each batch; greedy hands the whole turn to answer_prompts (which batches it by method)
        step = batch_size if settings["generation"]["mode"] == "sample" else len(active)
        for b in range(0, len(active), step):
            batch = active[b : b + step]
            if settings["generation"]["mode"] == "sample":
                torch.manual_seed(_seed(settings["generation"]["seed"], *seed_key, turn, b))
            prompts = [a[3] for a in batch]
            rows = answer_prompts(
                model, tokenizer, prompts, settings["max_new_tokens"], settings["method"], kwargs, batch_size
            )
            for (_, c, context, _, k), row in zip(batch, rows):
                finished = bool(row) and row[-1] in eos
                tokens = row[:-1] if finished else row
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                c["messages"] = context + [{"role": "assistant", "content": text}]
                c["pending"] = c["pending"][k + 1 :]
                c["answer_tokens"].append(len(tokens))
                c["answer_finished"].append(finished)
    keys = ("conversation_id", "source", "messages", "answer_tokens", "answer_finished")
    return [{k: c[k] for k in keys} for c in convs if c["answer_tokens"]]


def regenerate_split(
    model,
    tokenizer,
    out: Path,
    split: str,
    settings: dict,
    bench: BenchFilter,
    limit: int | None = None,
    meta: dict | None = None,
) -> dict:
    """Write (or resume) ``split``'s shards, each noted in ``meta`` (``regenerate.json``) as this run's; returns
    counts (conversations planned, shards, dropped by the filter)."""
    from tqdm.auto import tqdm

    stats: dict = {"dropped_bench_overlap": 0}
    items = clean_items(split, bench, stats)
    if limit is not None:
        items = (x for _, x in zip(range(limit), items))
    items = list(items)
    size = settings["shard_size"]
    shards = (len(items) + size - 1) // size
    done = sum(shard_done(out, split, s) for s in range(shards))
    bar = tqdm(
        total=len(items),
        initial=min(done * size, len(items)),
        desc=f"regenerating {split}",
        unit="conv",
        mininterval=10,
    )
    for s in range(shards):
        if shard_done(out, split, s):
            continue  # written by an earlier run (shards are renamed into place only when complete)
        path = shard_path(out, split, s)
        chunk = items[s * size : (s + 1) * size]
        t0 = time.perf_counter()
        records = regenerate_conversations(model, tokenizer, chunk, settings, split, seed_key=(split, s))
        write_shard(path, records)
        if meta is not None:
            record_shard(out, meta, path)
        seconds = time.perf_counter() - t0
        tokens = sum(sum(r["answer_tokens"]) for r in records)
        answers = sum(len(r["answer_tokens"]) for r in records)
        bar.update(len(chunk))
        bar.write(
            f"{split} shard {s:05d}/{shards}: {len(records)} conversations, {answers} answers, {tokens} tokens in "
            f"{seconds:.0f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s)"
        )
    bar.close()
    return {"planned": len(items), "shards": shards, **stats}


def regenerate(
    model,
    tokenizer,
    out: str | Path,
    splits=("validation", "train"),
    limit: int | None = None,
    max_new_tokens: int = 256,
    max_turns: int = 3,
    max_prompt_tokens: int = 1024,
    batch_size: int = DEFAULT_BATCH_SIZE,
    method: str = DEFAULT_METHOD,
    sample: bool = False,
    seed: int = 0,
    shard_size: int = 64,
    dtype: str = "fp32",
    command: str | None = None,
    assemble: bool = True,
) -> dict:
    """Regenerate ``splits`` into ``out`` (resuming an earlier run there), then :func:`finalize` unless not
    ``assemble``. Returns ``regenerate.json``'s dict."""
    if min(max_new_tokens, max_turns, max_prompt_tokens, batch_size, shard_size) < 1:
        raise SpecDecError(
            "--max-new-tokens, --max-turns, --max-prompt-tokens, --batch-size and --shard-size must be positive"
        )
    tokenizer.padding_side = "left"
    out = Path(out)
    bench = BenchFilter(bench_texts())
    settings = {
        "generation": generation_settings(model, sample, seed),
        "method": method,
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "max_turns": max_turns,
        "max_prompt_tokens": max_prompt_tokens,
        "shard_size": shard_size,
    }
    generate_kwargs(method, settings["generation"])  # an unknown method fails before any work
    meta = open_run(out, regeneration_metadata(model, tokenizer, settings, bench, dtype), command)
    meta.setdefault("splits", {})
    for split in splits:
        meta["splits"][split] = regenerate_split(model, tokenizer, out, split, settings, bench, limit, meta)
        write_meta(out, meta)
    return finalize(out, tokenizer) if assemble else meta
