"""Training data from ShareGPT in the target's chat template.

- ``tokenize_chat``: one conversation -> ``input_ids`` and ``labels`` where only assistant answers
  (content and closing tag) are supervised; prompt and template tokens get -100.
- ``sft_dataset``: conversations as individual SFT samples (SPACE's SAR-SFT and its SFT baseline).
- ``packed_dataset``: conversations concatenated and cut into fixed blocks (drafter training).
- ``install_draft_vocab``: a drafter's reduced draft vocabulary from the training data's token frequencies.
"""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from datasets import Dataset

from hf_specdec.errors import SpecDecError
from hf_specdec.tasks import render_plain, sharegpt_conversations

IGNORE_INDEX = -100


def _render(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return render_plain(messages)


def tokenize_chat(tokenizer, messages: list[dict], max_length: int | None = None) -> dict:
    """Token ids of a rendered conversation and labels that supervise only assistant turns.

    The conversation is rendered once per prefix and each message's new text is tokenized on its own,
    so label boundaries are exact. An assistant message's template header (e.g. ``<|im_start|>assistant\\n``)
    is not supervised: the header is the rendering of an empty assistant turn up to where its content starts.
    """
    if not messages:
        raise SpecDecError("empty conversation: nothing to tokenize")
    input_ids: list[int] = []
    labels: list[int] = []
    previous = ""
    for i, message in enumerate(messages):
        text = _render(tokenizer, messages[: i + 1])
        if not text.startswith(previous):
            raise SpecDecError(
                "the chat template does not render conversations prefix by prefix; cannot align labels"
            )
        segment, previous = text[len(previous) :], text
        if message["role"] == "assistant" and message["content"] and message["content"] in segment:
            head_len = segment.index(message["content"])
            head = tokenizer(segment[:head_len], add_special_tokens=False).input_ids
            body = tokenizer(segment[head_len:], add_special_tokens=False).input_ids
            input_ids += head + body
            labels += [IGNORE_INDEX] * len(head) + body
        else:
            ids = tokenizer(segment, add_special_tokens=False).input_ids
            input_ids += ids
            labels += [IGNORE_INDEX] * len(ids)
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    return {"input_ids": input_ids, "labels": labels}


def sft_dataset(
    tokenizer,
    split: str = "train",
    max_length: int = 512,
    limit: int | None = None,
    min_answer_tokens: int = 8,
) -> Dataset:
    """One sample per conversation (first user turn + first assistant turn), truncated to ``max_length``."""
    rows = []
    for messages in sharegpt_conversations(split):
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        sample = tokenize_chat(tokenizer, messages[: first + 1], max_length)
        if sum(label != IGNORE_INDEX for label in sample["labels"]) >= min_answer_tokens:
            rows.append(sample)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise SpecDecError(f"no usable ShareGPT conversations in split {split!r}")
    return Dataset.from_list(rows)


def packed_dataset(
    tokenizer, split: str = "train", block_size: int = 512, limit: int | None = None
) -> Dataset:
    """Whole conversations, concatenated and cut into ``block_size`` blocks (``limit`` blocks at most)."""
    rows, ids, labels = [], [], []
    for messages in sharegpt_conversations(split):
        sample = tokenize_chat(tokenizer, messages)
        ids += sample["input_ids"]
        labels += sample["labels"]
        while len(ids) >= block_size:
            rows.append({"input_ids": ids[:block_size], "labels": labels[:block_size]})
            ids, labels = ids[block_size:], labels[block_size:]
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise SpecDecError(f"no ShareGPT text in split {split!r} to pack")
    return Dataset.from_list(list(itertools.islice(rows, limit)))


def conversation_rows(tokenizer, split: str, length: int, limit: int | None = None) -> Dataset:
    """``packed_dataset``'s ShareGPT as one row per conversation from its start, ``length`` tokens at most
    (``tokenized.conversations_from_corpus`` from the live tokenizer)."""
    rows = []
    for messages in itertools.islice(sharegpt_conversations(split), limit):
        rows.append(tokenize_chat(tokenizer, messages, max_length=length))
    if not rows:
        raise SpecDecError(f"no ShareGPT conversations in split {split!r}")
    return Dataset.from_list(rows)


def frequent_tokens(dataset, size: int, always: list[int]) -> tuple[torch.Tensor, Counter]:
    """The ``size`` most frequent supervised tokens of ``dataset`` (plus the ``always`` ids; then any tokens of the
    inputs, then the lowest ids, if the data has fewer distinct tokens), sorted, and the supervised token counts."""
    counts: Counter = Counter()
    inputs: Counter = Counter()
    for row in dataset:
        labels, ids = row["labels"], row["input_ids"]
        if isinstance(labels, torch.Tensor):  # a feature store's rows
            labels, ids = labels.tolist(), ids.tolist()
        counts.update(t for t in labels if t >= 0)
        inputs.update(ids)
    ranked = [*always, *(t for t, _ in counts.most_common()), *(t for t, _ in inputs.most_common())]
    keep = list(dict.fromkeys(ranked))[:size]
    seen = set(keep)
    keep += [t for t in range(size * 2) if t not in seen][: size - len(keep)]
    return torch.tensor(sorted(keep), dtype=torch.long), counts


def install_draft_vocab(drafter, dataset, tokenizer, size: int) -> float:
    """Give ``drafter`` the reduced draft vocabulary of the ``size`` most frequent supervised tokens of
    ``dataset`` (special tokens always kept; ``modeling/attached.py``); returns the share of supervised tokens
    it covers."""
    always = sorted(set(tokenizer.all_special_ids) | {tokenizer.eos_token_id})
    ids, counts = frequent_tokens(dataset, size, always)
    drafter.set_draft_vocab(ids)
    kept = set(ids.tolist())
    coverage = sum(c for t, c in counts.items() if t in kept) / max(sum(counts.values()), 1)
    print(f"draft vocabulary: {len(ids)} tokens cover {coverage:.1%} of supervised training tokens")
    return coverage


def stack_collator(rows: list[dict]) -> dict:
    """Token rows (lists) -> ``input_ids`` / ``labels``; feature-store rows (tensors) -> every key stacked."""
    if isinstance(rows[0]["input_ids"], torch.Tensor):
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    # rows of several lengths (whole conversations, ``--eval-context conversation``) are padded on the right with
    # unsupervised tokens: a causal model's earlier positions never see them, so no attention mask is needed
    n = max(len(r["input_ids"]) for r in rows)
    pad = {"input_ids": 0, "labels": IGNORE_INDEX}
    return {
        k: torch.tensor([list(r[k]) + [pad[k]] * (n - len(r[k])) for r in rows], dtype=torch.long)
        for k in ("input_ids", "labels")
    }
