"""The regenerated corpus assembled from its shards (at the end of ``hf-specdec corpus --regenerate``, or by
``--finalize`` at any time, also while a run is going on).

The shards written so far (``store.py``) become:

- ``OUT/dataset``: a ``datasets.DatasetDict`` (``datasets.load_from_disk``), one row per conversation: ``messages``
  (``[{"role", "content"}]``), ``source`` (``sharegpt-v3/{split}``), ``conversation_id`` (ShareGPT's id),
  ``answer_tokens`` and ``answer_finished`` (per answer: new tokens, and whether it ended on EOS rather than at
  ``max_new_tokens``); the settings are in each split's ``info.description`` (JSON) and in ``regenerate.json``;
- ``OUT/corpus.json`` and ``OUT/{split}.safetensors``: the same conversations pre-tokenized by
  ``data/tokenized.py``'s ``build_corpus``, so ``hf-specdec train ... --corpus OUT`` and ``hf-specdec features
  --corpus OUT`` read it as they read ``hf-specdec corpus --out DIR``'s ShareGPT.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hf_specdec.errors import SpecDecError

from .store import SOURCE, read_shard, shard_files, write_meta


def finalize(out: str | Path, tokenizer=None) -> dict:
    """Assemble the shards written so far into ``OUT/dataset`` and the pre-tokenized corpus; returns the metadata."""
    import shutil

    from datasets import Dataset, DatasetDict, DatasetInfo

    from ..data.tokenized import REGENERATED_SOURCE, build_corpus, tokenizer_fingerprint

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
        files = shard_files(out, split)
        if files:
            records[split] = [r for f in files for r in read_shard(f)]
    if not any(records.values()):
        raise SpecDecError(f"{out}: no regenerated conversations yet (no shards under {out / 'shards'})")
    summary = {
        split: {
            "conversations": len(rows),
            "answers": sum(len(r["answer_tokens"]) for r in rows),
            "answer_tokens": sum(sum(r["answer_tokens"]) for r in rows),
            "answers_finished": sum(sum(r["answer_finished"]) for r in rows),
            "shards": len(shard_files(out, split)),
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
        source=f"{REGENERATED_SOURCE}: {SOURCE}",
        extra={"regenerated": settings},
    )
    write_meta(out, meta)
    for split, s in summary.items():
        print(f"{split}: {s}")
    print(
        f"wrote {out / 'dataset'} (datasets.load_from_disk) and the pre-tokenized corpus {out / 'corpus.json'}"
    )
    return meta
