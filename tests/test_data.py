"""The regenerated corpora kept in the repository (``data/regen/``, data/README.md) are what their command makes: each
shard holds, in order, the bench-filtered ShareGPT conversations its index covers, none overlapping a bench text,
with the recorded settings of the current format and bench filter. A corpus committed from another
order, filter or format fails here, as does one that a change of the bench tasks has made stale."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hf_specdec.trainers.corpus.bench_overlap import BenchFilter, bench_texts, clean_items
from hf_specdec.trainers.corpus.store import (
    REGEN_FORMAT,
    SHARD_SUFFIXES,
    read_shard,
    shard_files,
    shard_path,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "regen"
RUNS = sorted(p.parent for p in DATA.glob("*/regenerate.json"))


@pytest.fixture(scope="module")
def bench():
    return BenchFilter(bench_texts())


def clean_ids(split: str, bench: BenchFilter, count: int) -> list[str]:
    """The first ``count`` conversations the command answers, in order (the bench filter reads ~350 a second)."""
    return [cid for cid, _ in itertools.islice(clean_items(split, bench), count)]


def test_the_repository_keeps_its_regenerated_corpora():
    assert {p.name for p in RUNS} >= {"smollm2-fp32-first-turns", "smollm2-fp32-validation-64"}


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_kept_corpus_is_what_its_command_makes(run, bench):
    meta = json.loads((run / "regenerate.json").read_text())
    assert meta["format"] == REGEN_FORMAT
    assert meta["bench_filter"] == json.loads(json.dumps(bench.describe()))
    assert meta["generation"] == {"mode": "greedy"} and meta["dtype"] == "fp32"
    assert not list((run / "shards").glob(f"*{SHARD_SUFFIXES[1]}")), "commit the xz shards only"
    size, seen = meta["shard_size"], set()
    for split in ("train", "validation"):
        files = shard_files(run, split)
        planned = clean_ids(split, bench, len(files) * size)
        for index, path in enumerate(files):
            assert path == shard_path(run, split, index)  # no shard missing before it
            records = read_shard(path)
            ids = [r["conversation_id"] for r in records]
            kept = set(ids)
            chunk = planned[index * size : (index + 1) * size]
            # the chunk's conversations in order, less those whose first prompt is over the length limit (a split's
            # last shard covers what is left of it, so its chunk may be shorter than the shard size)
            assert chunk and ids == [cid for cid in chunk if cid in kept] and len(ids) > len(chunk) // 2
            assert not seen & kept
            seen |= kept
            for r in records:
                answers = [m for m in r["messages"] if m["role"] == "assistant"]
                assert r["source"] == f"sharegpt-v3/{split}" and 0 < len(answers) <= meta["max_turns"]
                assert (
                    len(r["answer_tokens"]) == len(answers)
                    and max(r["answer_tokens"]) <= meta["max_new_tokens"]
                )
                assert not bench.conversation_overlaps(r["messages"]), r["conversation_id"]
    assert seen
