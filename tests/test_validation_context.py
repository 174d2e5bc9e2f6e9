"""Validation on whole conversations (``--eval-context conversation``): each held-out row starts
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
    """A corpus folder by hand (``trainers/data/tokenized.py``'s format): each conversation's tokens from
    ``supervised_from`` on are supervised."""
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
    from hf_specdec.trainers.data.rows import eval_batch_size, training_blocks

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


def test_training_rows_can_be_whole_conversations(tmp_path):
    """``--train-context conversation``: training rows start at conversation starts, stop at ``--train-length``,
    carry their lengths for grouping, and a batch holds as many tokens as ``--batch-size`` packed blocks at most."""
    from hf_specdec.trainers.data.rows import rows_per_batch, train_tokens, training_blocks

    convs = [list(range(10, 16)), list(range(20, 34)), list(range(40, 49))]
    _write_corpus(tmp_path / "c", convs)
    args = _args(tmp_path / "c", train_context="conversation", train_length=12, max_steps=3)
    train, _ = training_blocks(args, None)
    assert train["input_ids"] == [convs[0], convs[1][:12], convs[2]]
    assert train["length"] == [6, 12, 9]
    packed, _ = training_blocks(_args(tmp_path / "c", max_steps=3), None)
    assert packed["input_ids"][1] == [22, 23, 24, 25, 26, 27, 28, 29]  # mid-conversation
    wide = dict(batch_size=8, block_size=256, train_context="conversation", train_length=1024)
    assert rows_per_batch(_args(tmp_path, **wide), "train") == 2
    assert rows_per_batch(_args(tmp_path, **{**wide, "batch_size": 1}), "train") == 1
    assert rows_per_batch(_args(tmp_path, **{**wide, "train_context": "packed"}), "train") == 8
    # tokens trained on: rows seen x the mean row length (27 tokens / 3 rows), or x the block size
    assert train_tokens(args, train, steps=3, processes=2) == 6 * 9
    assert train_tokens(_args(tmp_path, max_steps=3), packed, steps=3, processes=2) == 6 * 8


def test_skip_train_rows_continues_on_unseen_rows(tmp_path):
    """``--skip-train-rows N``: the run's rows are the split's rows after the first N (continued training on text
    a warm-start drafter has not seen), packed or whole; the card's data line says so; bad values fail early."""
    from hf_specdec.trainers.data.rows import describe_rows, skipped_rows, training_blocks

    convs = [list(range(10, 18)), list(range(20, 28)), list(range(30, 38)), list(range(40, 48))]
    _write_corpus(tmp_path / "c", convs, supervised_from=0)
    packed, _ = training_blocks(_args(tmp_path / "c", max_steps=2, skip_train_rows=1), None)
    assert packed["input_ids"] == [convs[1], convs[2]]
    args = _args(tmp_path / "c", max_steps=2, skip_train_rows=3, train_context="conversation", train_length=8)
    assert training_blocks(args, None)[0]["input_ids"] == [convs[3]]
    assert describe_rows(args, "train").endswith("after the split's first 3 rows")
    with pytest.raises(SpecDecError, match="holds only 4 rows; skip fewer"):
        training_blocks(_args(tmp_path / "c", skip_train_rows=4), None)
    with pytest.raises(SpecDecError, match="0 or more"):
        skipped_rows(_args(tmp_path, skip_train_rows=-1))
    with pytest.raises(SpecDecError, match="feature store"):
        skipped_rows(_args(tmp_path, skip_train_rows=5, features="store"))


def test_warm_start_card_counts_the_tokens_before(tmp_path):
    """A continued run's card adds the tokens its ``--init-from`` drafter's card records (or their total)."""
    from hf_specdec.trainers.drafters.run import warm_start_tokens

    (tmp_path / "model_card.json").write_text(json.dumps({"train_tokens": 1000}))
    assert warm_start_tokens(argparse.Namespace(init_from=str(tmp_path)), 24) == {"train_tokens_total": 1024}
    (tmp_path / "model_card.json").write_text(json.dumps({"train_tokens": 1000, "train_tokens_total": 3000}))
    assert warm_start_tokens(argparse.Namespace(init_from=str(tmp_path)), 24) == {"train_tokens_total": 3024}
    assert warm_start_tokens(argparse.Namespace(init_from=None), 24) == {}


def test_card_architecture_says_how_the_drafter_started():
    """The architecture line names a warm start and the draft vocabulary it kept, not ``--init`` and no vocabulary."""
    from hf_specdec.trainers.drafters.card import draft_vocab_words, init_words

    config = argparse.Namespace(draft_vocab_size=8192)
    assert init_words(argparse.Namespace(init="target", init_from=None)) == "init target"
    assert init_words(argparse.Namespace(init="target", init_from="runs/edd")) == "warm start (--init-from)"
    assert draft_vocab_words(config, 0.952) == "8192 (coverage 95.2%)"
    assert draft_vocab_words(config, None) == "8192 (the --init-from drafter's)"
    assert draft_vocab_words(argparse.Namespace(draft_vocab_size=None), None) is None


def test_conversation_training_rows_are_checked_early(tmp_path):
    from hf_specdec.trainers.data.rows import whole_conversations

    with pytest.raises(SpecDecError, match="--train-length must be at least 2"):
        whole_conversations(_args(tmp_path, train_context="conversation", train_length=1), "train")
    with pytest.raises(SpecDecError, match="feature store"):
        whole_conversations(
            _args(tmp_path, train_context="conversation", train_length=64, features="store"), "train"
        )


@pytest.mark.parametrize("recipe", ["edd", "glide"])
def test_eval_only_is_checked_before_the_target_loads(recipe, tmp_path, capsys):
    """``--eval-only`` validates a saved drafter: without ``--init-from``, or with an option only training uses, it is
    a one-line error before anything loads (the target path does not exist)."""
    from hf_specdec.cli import main

    base = ["train", recipe, "--output-dir", str(tmp_path / "o"), "--model", str(tmp_path / "missing")]
    assert main([*base, "--eval-only"]) == 2
    assert "--init-from DIR" in capsys.readouterr().err
    for extra in (["--resume"], ["--skip-train-rows", "8"], ["--features", "store"]):
        assert main([*base, "--eval-only", "--init-from", str(tmp_path), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert extra[0] in err and "would do nothing" in err and len(err.splitlines()) == 1
    assert main([*base, "--init-from", str(tmp_path), "--add-to-card"]) == 2
    assert "add --eval-only" in capsys.readouterr().err
    # a training run gets as far as the missing target
    assert main([*base, "--init-from", str(tmp_path)]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_padding_adds_nothing_to_the_training_loss(tmp_path, kind):
    """A training batch of rows of several lengths: its summed loss (what ``Trainer.train`` divides by the batch's
    supervised tokens) is the sum of each row's alone, and its gradient too (EDD's block length L drawn the same)."""
    from hf_specdec.trainers.data.chat import stack_collator

    target, drafter = _tiny_drafter(kind)
    torch.manual_seed(1)
    rows = [{"input_ids": r, "labels": r} for r in (torch.randint(3, 90, (n,)).tolist() for n in (24, 13))]
    trainer = _eval_trainer(tmp_path, target, drafter, rows)
    drafter.train()

    def loss_and_grad(batch_rows):
        torch.manual_seed(2)
        drafter.zero_grad()
        loss = trainer.compute_loss(drafter, stack_collator(batch_rows), num_items_in_batch=torch.tensor(1))
        loss.backward()
        return loss.detach(), torch.cat(
            [p.grad.flatten() for p in drafter.parameters() if p.grad is not None]
        )

    both, grad_both = loss_and_grad(rows)
    alone = [loss_and_grad([row]) for row in rows]
    assert both == pytest.approx(float(alone[0][0] + alone[1][0]), rel=1e-5)
    torch.testing.assert_close(grad_both, alone[0][1] + alone[1][1], rtol=1e-4, atol=1e-6)


def test_eval_corpus_validates_on_other_text_than_the_training_corpus(tmp_path):
    """``--eval-corpus``: training rows from ``--corpus``, validation rows from another corpus (the ablation's
    held-out regenerated text for runs trained on ShareGPT), and the card says which."""
    from hf_specdec.trainers.data.rows import training_blocks, validation_rows

    _write_corpus(tmp_path / "train", [list(range(10, 30))])
    _write_corpus(tmp_path / "held", [list(range(50, 56)), list(range(60, 66))])
    args = _args(tmp_path / "train", eval_corpus=str(tmp_path / "held"), max_steps=2)
    train, valid = training_blocks(args, None)
    assert train["input_ids"][0] == list(range(10, 18))
    assert valid["input_ids"] == [list(range(50, 56)), list(range(60, 66))]
    assert (
        validation_rows(args)
        == "held-out conversations, first 10 tokens each, of corpus held's validation split (test)"
    )
    (tmp_path / "held" / "corpus.json").write_text(
        json.dumps({"format": 1, "source": "regenerated by the target: x"})
    )
    assert validation_rows(args).endswith("of corpus held's validation split (the target's own answers)")


def test_conversation_training_batches_group_rows_by_length(tmp_path):
    """The ``TrainingArguments`` of a ``--train-context conversation`` run: rows per batch as many as fit
    ``--batch-size`` blocks' tokens, batched by length; a packed run keeps ``--batch-size`` blocks, sampled at random."""
    import argparse

    from hf_specdec.trainers.drafters.glide import add_arguments
    from hf_specdec.trainers.drafters.run import training_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--output-dir", str(tmp_path), "--batch-size", "8", "--block-size", "256", "--precision", "fp32"]
    conv = training_arguments(
        p.parse_args([*base, "--train-context", "conversation", "--train-length", "512"])
    )
    assert (conv.per_device_train_batch_size, conv.train_sampling_strategy) == (4, "group_by_length")
    packed = training_arguments(p.parse_args(base))
    assert (packed.per_device_train_batch_size, packed.train_sampling_strategy) == (8, "random")
    # the Trainer writes args.use_cache into the drafter's config, which is saved with it: keep it decoding-ready
    assert packed.use_cache is True


def test_the_final_validation_is_not_run_twice():
    """The Trainer evaluates at ``max_steps``: the run's card takes those figures instead of a second pass; a run
    stopped before its last evaluation (time limit, ``--stop-at-step``) evaluates anew."""
    from types import SimpleNamespace

    from hf_specdec.trainers.drafters.run import final_validation

    calls = []
    logged = {"eval_loss": 1.5, "eval_top1_match": 0.25, "epoch": 1.0, "step": 8}
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=8, log_history=[{"loss": 2.0, "step": 8}, logged]),
        evaluate=lambda: calls.append(1) or {"eval_loss": 9.0},
    )
    assert final_validation(trainer) == {"eval_loss": 1.5, "eval_top1_match": 0.25, "epoch": 1.0}
    assert calls == []
    trainer.state.global_step = 9
    assert final_validation(trainer) == {"eval_loss": 9.0}
    assert calls == [1]


def test_mix_corpus_interleaves_equal_shares_after_the_skip(tmp_path):
    """``--mix-corpus``: rows alternate between ``--corpus`` and each mixed corpus (its first ``--mix-skip-rows``
    skipped), each giving half the run's rows; a shorter part starts over; the card's data line names the mix; bad
    uses fail early."""
    from hf_specdec.trainers.data.rows import describe_rows, mixed_corpora, training_blocks

    own = [list(range(10, 18)), list(range(20, 28)), list(range(30, 38))]
    other = [list(range(50, 58)), list(range(60, 68)), list(range(70, 78)), list(range(80, 88))]
    _write_corpus(tmp_path / "own", own, supervised_from=0)
    _write_corpus(tmp_path / "other", other, supervised_from=0)
    args = _args(tmp_path / "own", max_steps=4, mix_corpus=[str(tmp_path / "other")], mix_skip_rows=1)
    train, _ = training_blocks(args, None)
    assert train["input_ids"] == [own[0], other[1], own[1], other[2]]
    args = _args(tmp_path / "own", max_steps=6, mix_corpus=[str(tmp_path / "other")], mix_skip_rows=2)
    # 3 rows each asked; the other holds 2 after the skip: it starts over
    train, _ = training_blocks(args, None)
    assert train["input_ids"] == [own[0], other[2], own[1], other[3], own[2], other[2]]
    words = describe_rows(args, "train")
    # named by its folder, as the card names --corpus: no local path in a card meant for the Hub
    assert (
        "interleaved row by row, in equal shares, with the corpus folder other (test) after its first 2 rows"
        in words
    )
    assert str(tmp_path) not in words
    whole = _args(
        tmp_path / "own",
        max_steps=2,
        train_context="conversation",
        train_length=4,
        mix_corpus=[str(tmp_path / "other")],
    )
    train, _ = training_blocks(whole, None)
    assert train["input_ids"] == [own[0][:4], other[0][:4], own[1][:4], other[1][:4]]  # 2 rows a batch
    assert train["length"] == [4, 4, 4, 4]
    with pytest.raises(SpecDecError, match="holds only 4 rows; skip fewer"):
        training_blocks(_args(tmp_path / "own", mix_corpus=[str(tmp_path / "other")], mix_skip_rows=4), None)
    with pytest.raises(SpecDecError, match="give the first with --corpus"):
        mixed_corpora(argparse.Namespace(corpus=None, mix_corpus=[str(tmp_path / "other")]))
    with pytest.raises(SpecDecError, match="no corpus.json there"):
        mixed_corpora(_args(tmp_path / "own", mix_corpus=[str(tmp_path / "missing")]))
    with pytest.raises(SpecDecError, match="feature store"):
        mixed_corpora(_args(tmp_path / "own", mix_corpus=[str(tmp_path / "other")], features="store"))
    with pytest.raises(SpecDecError, match="0 or more"):
        mixed_corpora(_args(tmp_path / "own", mix_skip_rows=-1))
