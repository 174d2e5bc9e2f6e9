"""The pre-tokenized training corpus (trainers/data/tokenized.py) and the shared drafter training entry
(trainers/drafters/run.py)."""

from __future__ import annotations

import argparse

import pytest
import torch

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama


@pytest.fixture(scope="module")
def small_corpus(real_target, tmp_path_factory):
    from hf_specdec.trainers.data.tokenized import build_corpus

    out = tmp_path_factory.mktemp("corpus")
    build_corpus(real_target[1], out, limit_conversations=12)
    return out


@pytest.mark.real
def test_corpus_blocks_equal_live_tokenization(real_target, small_corpus):
    """Training from the corpus sees exactly the blocks (ids and assistant-only labels) tokenizing ShareGPT gives."""
    from hf_specdec.trainers.data.chat import packed_dataset
    from hf_specdec.trainers.data.tokenized import packed_from_corpus

    tok = real_target[1]
    for split, limit in (("train", 20), ("validation", 6)):
        stored = packed_from_corpus(small_corpus, split, 128, limit, tok)
        live = packed_dataset(tok, split, 128, limit=limit)
        assert len(stored) == len(live) == limit
        assert stored["input_ids"] == live["input_ids"]
        assert stored["labels"] == live["labels"]
        assert any(x == -100 for row in stored["labels"] for x in row)  # prompts are not supervised
        assert any(x >= 0 for row in stored["labels"] for x in row)


@pytest.mark.real
def test_corpus_first_turns_equal_live_sft_samples(real_target, small_corpus):
    """`train space --corpus` trains on the samples `sft_dataset` tokenizes from ShareGPT's first turns: the same
    ids, labels and truncation, the first answer's closing tag included and nothing after it."""
    from hf_specdec.trainers.data.chat import sft_dataset
    from hf_specdec.trainers.data.tokenized import first_turns

    tok = real_target[1]
    for split, length in (("train", 96), ("validation", 4096)):
        stored = first_turns(tok, split, length, limit=6, corpus=str(small_corpus))
        live = sft_dataset(tok, split, length, limit=6)
        assert len(stored) == len(live) == 6
        assert stored["input_ids"] == live["input_ids"]
        assert stored["labels"] == live["labels"]
    assert max(map(len, stored["input_ids"])) > 96  # the long split was not cut at 96
    assert all(row[-1] >= 0 for row in stored["labels"])  # a whole first answer ends supervised


@pytest.mark.real
def test_corpus_refuses_another_tokenizer_and_a_corrupt_file(real_target, small_corpus, tmp_path):
    import shutil

    from hf_specdec.trainers.data.tokenized import packed_from_corpus
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(real_target[1].name_or_path)
    other.add_tokens(["<an-extra-token>"])
    with pytest.raises(SpecDecError, match="another tokenizer"):
        packed_from_corpus(small_corpus, "train", 128, 4, other)
    broken = tmp_path / "broken"
    shutil.copytree(small_corpus, broken)
    data = (broken / "train.safetensors").read_bytes()
    (broken / "train.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(SpecDecError, match="unreadable.*hf-specdec corpus"):
        packed_from_corpus(broken, "train", 128, 4)
    with pytest.raises(SpecDecError, match="hf-specdec corpus --out"):
        packed_from_corpus(tmp_path / "missing", "train", 128, 4)


def test_training_puts_the_target_on_the_trainers_device(monkeypatch, tmp_path):
    """The Trainer moves only the drafter: the run places the frozen target on ``TrainingArguments.device``
    before the drafter is built (a 'meta' device stands in for a GPU)."""

    from hf_specdec.trainers.drafters import run as drafter_run

    target = tiny_llama()

    class Args:  # what run_drafter_training reads before building the drafter
        device = torch.device("meta")
        world_size = 1

    class Built(Exception):
        pass

    def build(args, t):
        assert {p.device.type for p in t.parameters()} == {"meta"}
        raise Built

    monkeypatch.setattr("hf_specdec.target.load_target", lambda *a, **k: (target, None))
    monkeypatch.setattr(
        drafter_run, "training_blocks", lambda args, tok, processes, with_train=True: ([], [])
    )
    monkeypatch.setattr(drafter_run, "training_arguments", lambda args: Args())
    args = argparse.Namespace(
        max_steps=1, seed=0, model=None, gguf_file=None, dtype="fp32", features=None,
        output_dir=str(tmp_path / "run"), resume=None,
    )  # fmt: skip
    recipe = drafter_run.DrafterRecipe("x", build, None, None, None, None)
    with pytest.raises(Built):
        drafter_run.run_drafter_training(args, recipe)


def test_kl_loss_option_trains_on_the_target_distribution_alone(tmp_path):
    """DrafterTrainer(loss="kl") is KL(P_t || P_d) with no cross-entropy term: it does not read the labels' tokens."""

    from hf_specdec.modeling import GlideConfig, GlideForCausalLM
    from hf_specdec.trainers.drafters.losses import kl_loss
    from hf_specdec.trainers.drafters.trainer import DrafterTrainer
    from transformers import TrainingArguments

    target = tiny_llama(num_hidden_layers=4)
    drafter = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target)
    args = TrainingArguments(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, remove_unused_columns=False
    )
    ids = torch.randint(3, 97, (2, 16))
    labels = ids.clone()
    labels[:, :4] = -100
    losses = {}
    for kind in ("kl", "ce"):
        trainer = DrafterTrainer(model=drafter, args=args, target=target, loss=kind)
        losses[kind] = trainer.compute_loss(drafter, {"input_ids": ids, "labels": labels})
        other = labels.clone()
        other[labels >= 0] = (labels[labels >= 0] + 1) % 97  # other gold tokens, same supervised positions
        changed = trainer.compute_loss(drafter, {"input_ids": ids, "labels": other})
        assert torch.equal(changed, losses[kind]) == (kind == "kl")
    r = DrafterTrainer(model=drafter, args=args, target=target)._forward(drafter, ids, labels, True)
    torch.testing.assert_close(losses["kl"], kl_loss(r["logits"], r["target_logits"]))
    with pytest.raises(SpecDecError, match="'ce' or 'kl'"):
        DrafterTrainer(model=drafter, args=args, target=target, loss="mse")


def test_glide_gradients_stay_finite_with_fully_masked_cross_attention_rows():
    """Block 0 of the block-wise mask sees no target position: those rows must not put NaN into any gradient."""

    from hf_specdec.modeling import GlideConfig, GlideForCausalLM
    from hf_specdec.modeling.masks import blockwise_cross_mask

    target = tiny_llama(num_hidden_layers=4)
    drafter = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target)
    ids = torch.randint(3, 97, (2, 12))
    with torch.no_grad():
        cache = target.model(input_ids=ids, use_cache=True).past_key_values
    mask = blockwise_cross_mask(12, 5)
    assert not bool(mask[:5].any())  # the first block's rows are fully masked
    import hf_specdec.modeling.glide as glide_module

    masks, sdpa = [], glide_module.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    glide_module.F.scaled_dot_product_attention = spy
    try:
        hidden = drafter.hidden_states(ids, target_past_key_values=cache, cross_attention_mask=mask)
    finally:
        glide_module.F.scaled_dot_product_attention = sdpa
    # some kernels (CUDA's) give NaN for a fully masked row: none may reach the kernel
    assert masks and all(bool(m.any(-1).all()) for m in masks)
    hidden.float().square().mean().backward()
    grads = [p.grad for p in drafter.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
