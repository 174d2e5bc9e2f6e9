"""Validation on whole conversations (``--eval-context conversation``, issue #32 point 4): each held-out row starts
where its conversation starts, as the context does when decoding, and rows of several lengths batch without changing
any figure."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from hf_specdec.errors import SpecDecError

from .test_glide_training import _eval_trainer, _tiny_drafter


def _write_corpus(root, conversations: list[list[int]], supervised_from: int = 2) -> None:
    """A corpus folder by hand (``trainers/corpus.py``'s format): each conversation's tokens from ``supervised_from``
    on are supervised."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    ids = np.concatenate([np.asarray(c, dtype=np.uint16) for c in conversations])
    supervised = np.concatenate([np.arange(len(c)) >= supervised_from for c in conversations])
    offsets = np.cumsum([0, *map(len, conversations)]).astype(np.int64)
    for split in ("train", "validation"):
        save_file(
            {"ids": ids, "supervised": np.packbits(supervised), "offsets": offsets},
            str(root / f"{split}.safetensors"),
        )
    (root / "corpus.json").write_text(json.dumps({"format": 1, "source": "test"}))


def _args(corpus, **kw) -> argparse.Namespace:
    base = dict(
        corpus=str(corpus),
        block_size=8,
        max_steps=1,
        batch_size=1,
        grad_accum=1,
        eval_tokens=20000,
        eval_blocks=None,
        eval_context="conversation",
        eval_length=10,
    )
    return argparse.Namespace(**{**base, **kw})


def test_validation_rows_start_at_each_conversation_and_stop_at_eval_length(tmp_path):
    from hf_specdec.trainers.drafter_run import eval_batch_size, training_blocks

    convs = [list(range(10, 16)), list(range(20, 34)), list(range(40, 49))]  # 6, 14 and 9 tokens
    _write_corpus(tmp_path / "c", convs)
    _, valid = training_blocks(_args(tmp_path / "c"), None, with_train=False)
    assert valid["input_ids"] == [convs[0], convs[1][:10], convs[2]]
    assert valid["labels"][0] == [-100, -100, 12, 13, 14, 15]
    # packed blocks cut the stream wherever it falls: the second block starts inside the second conversation
    _, packed = training_blocks(_args(tmp_path / "c", eval_context="packed"), None, with_train=False)
    assert packed["input_ids"][1] == [22, 23, 24, 25, 26, 27, 28, 29]
    _, two = training_blocks(_args(tmp_path / "c", eval_blocks=2), None, with_train=False)
    assert len(two) == 2
    # validation batches hold as many tokens as a training batch (8 blocks of 256 -> two 1024-token conversations),
    # and two rows at least (the other-context control reads another row)
    wide = dict(batch_size=8, block_size=256, eval_length=1024)
    assert eval_batch_size(_args(tmp_path, **wide)) == 2
    assert eval_batch_size(_args(tmp_path, **{**wide, "batch_size": 16})) == 4
    assert eval_batch_size(_args(tmp_path, **{**wide, "batch_size": 2})) == 2
    assert eval_batch_size(_args(tmp_path, **wide, eval_context="packed")) == 8
    with pytest.raises(SpecDecError, match="--eval-length must be at least 2"):
        training_blocks(_args(tmp_path / "c", eval_length=1), None, with_train=False)


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_rows_of_several_lengths_validate_as_each_row_alone(tmp_path, kind):
    """The collator pads a batch's shorter rows on the right with unsupervised tokens: the batch's figures are
    the token-weighted mean of each row's own, and only real tokens are counted."""
    from datasets import Dataset

    target, drafter = _tiny_drafter(kind)
    torch.manual_seed(1)
    rows = [{"input_ids": r, "labels": r} for r in (torch.randint(3, 90, (n,)).tolist() for n in (24, 13))]
    trainer = _eval_trainer(tmp_path, target, drafter, rows)
    both = trainer.evaluate()
    alone = [trainer.evaluate(Dataset.from_list([row])) for row in rows]
    assert both["eval_tokens"] == sum(m["eval_tokens"] for m in alone) == 23 + 12
    for key in ("eval_top1_match", "eval_kl", "eval_alpha", "eval_loss"):
        weighted = sum(m[key] * m["eval_tokens"] for m in alone) / both["eval_tokens"]
        assert both[key] == pytest.approx(weighted, rel=1e-5, abs=1e-6), key
