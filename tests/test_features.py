"""The feature store (trainers/drafters/features.py): what the drafter reads, kept from one target pass, equals a
fresh pass, and training from it gives the loss training from the live target gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_specdec.trainers.data.chat import stack_collator
from hf_specdec.trainers.data.tokenized import CORPUS_FORMAT
from hf_specdec.trainers.drafters.features import FeatureStore, build_features, drafter_for_kind
from hf_specdec.trainers.drafters.losses import teacher_top_k, top_k_kl_loss
from hf_specdec.trainers.drafters.trainer import DrafterTrainer
from transformers import TrainingArguments

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama

BLOCK = 16


def write_corpus(folder, blocks: int):
    """A token corpus in ``hf-specdec corpus``'s format in ``folder``: ``blocks`` blocks (plus 5) of random tokens,
    the first third of every 12 unsupervised. Returns ``folder``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    n = blocks * BLOCK + 5
    ids = rng.integers(3, 97, n).astype(np.uint16)
    supervised = (np.arange(n) % 12) >= 4
    save_file(
        {"ids": ids, "supervised": np.packbits(supervised), "offsets": np.array([0, n], dtype=np.int64)},
        str(folder / "train.safetensors"),
    )
    (folder / "corpus.json").write_text(json.dumps({"format": CORPUS_FORMAT, "tokenizer_sha1": "x"}))
    return folder


@pytest.fixture
def corpus(tmp_path):
    """A 10-block corpus (:func:`write_corpus`)."""
    return write_corpus(tmp_path, 10)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_hidden_layers=4)


@pytest.mark.parametrize("kind", ["edd", "glide", "vanilla"])
def test_stored_features_equal_a_fresh_target_pass(kind, target, corpus, tmp_path):
    drafter = drafter_for_kind(kind, target).eval()
    meta = build_features(
        target, drafter, corpus, tmp_path / "store", BLOCK, top_k=5, dtype="fp32", batch_size=3
    )
    store = FeatureStore(tmp_path / "store")
    assert len(store) == meta["blocks"] == 10
    rows = [store[i] for i in (0, 7)]
    ids = torch.stack([r["input_ids"] for r in rows])
    fwd = drafter.target_forward_kwargs() or {}
    with torch.no_grad():
        out = target.base_model(input_ids=ids, **fwd)
        fresh = drafter.features_from_target(out)
        t_ids, t_logp = teacher_top_k(target.get_output_embeddings()(out.last_hidden_state[:, :-1]), 5)
    assert sorted(k for k in rows[0] if k.startswith("feature.")) == sorted(f"feature.{k}" for k in fresh)
    assert (kind == "vanilla") == (not fresh)
    for name, value in fresh.items():
        torch.testing.assert_close(torch.stack([r[f"feature.{name}"] for r in rows]), value)
    assert torch.equal(torch.stack([r["teacher_ids"] for r in rows]).long(), t_ids)
    torch.testing.assert_close(torch.stack([r["teacher_logp"] for r in rows]), t_logp)
    store.check(drafter, target)
    # a bf16 store keeps the same features at bf16
    build_features(target, drafter, corpus, tmp_path / "bf16", BLOCK, top_k=5, dtype="bf16")
    low = FeatureStore(tmp_path / "bf16")[7]
    for name, value in fresh.items():
        assert low[f"feature.{name}"].dtype == torch.bfloat16
        assert torch.equal(low[f"feature.{name}"], value[1].to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_training_from_the_store_gives_the_live_loss(kind, target, corpus, tmp_path):
    drafter = drafter_for_kind(kind, target).eval()  # eval: EDD's fixed block length, no randomness
    build_features(target, drafter, corpus, tmp_path / "store", BLOCK, top_k=6, dtype="fp32")
    store = FeatureStore(tmp_path / "store")
    args = TrainingArguments(
        output_dir=str(tmp_path / "t"), report_to=[], use_cpu=True, remove_unused_columns=False
    )
    trainer = DrafterTrainer(model=drafter, args=args, target=target, loss="kl", teacher_top_k=6)
    stored = stack_collator([store[i] for i in range(4)])
    live = {"input_ids": stored["input_ids"], "labels": stored["labels"]}
    from_store = trainer.compute_loss(drafter, stored)
    from_target = trainer.compute_loss(drafter, live)
    torch.testing.assert_close(from_store, from_target)
    assert from_store > 0
    # and the top-k teacher is a real truncation of the full one: with k = vocab it is the full KL
    full = DrafterTrainer(model=drafter, args=args, target=target, loss="kl")
    r = full._forward(drafter, live["input_ids"], live["labels"], True)
    ids, logp = teacher_top_k(r["target_logits"], r["target_logits"].shape[-1])
    torch.testing.assert_close(top_k_kl_loss(r["logits"], ids, logp), full.compute_loss(drafter, live))


def test_a_store_resumes_and_refuses_what_does_not_fit(target, corpus, tmp_path):
    import hf_specdec.trainers.drafters.features as features

    drafter = drafter_for_kind("edd", target)
    old = features.SHARD_BLOCKS
    features.SHARD_BLOCKS = 4  # 10 blocks -> 3 shards
    try:
        build_features(target, drafter, corpus, tmp_path / "s", BLOCK, top_k=4, dtype="fp32")
        shards = sorted((tmp_path / "s").glob("shard-*.safetensors"))
        assert len(shards) == 3
        kept = shards[0].stat().st_mtime_ns
        shards[1].unlink()  # an interrupted build
        with pytest.raises(SpecDecError, match="shard-00001.safetensors is missing.*again"):
            FeatureStore(tmp_path / "s")
        build_features(target, drafter, corpus, tmp_path / "s", BLOCK, top_k=4, dtype="fp32")
        assert (
            shards[1].is_file() and shards[0].stat().st_mtime_ns == kept
        )  # only the missing shard was written
        assert len(FeatureStore(tmp_path / "s")) == 10
        with pytest.raises(SpecDecError, match="other settings"):
            build_features(target, drafter, corpus, tmp_path / "s", BLOCK, top_k=8, dtype="fp32")
    finally:
        features.SHARD_BLOCKS = old
    with pytest.raises(SpecDecError, match="made for a drafter with"):
        FeatureStore(tmp_path / "s").check(drafter_for_kind("glide", target))
    with pytest.raises(SpecDecError, match="no features.json.*hf-specdec features"):
        FeatureStore(tmp_path / "nowhere")


def test_the_target_runs_where_the_user_asks():
    """``--device``: nothing moves to a GPU unless asked (default cpu); a malformed name or an accelerator the machine
    lacks is a clear error; build_features runs wherever the target already is."""
    import argparse

    from hf_specdec.trainers.drafters.features import add_parser, resolve_device

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["features", "--kind", "edd", "--corpus", "c", "--out", "o"])
    assert args.device == "cpu" and resolve_device(args.device) == torch.device("cpu")
    with pytest.raises(SpecDecError, match="--device 'gpu0' is not a torch device"):
        resolve_device("gpu0")
    if torch.cuda.device_count() < 8:
        with pytest.raises(SpecDecError, match=r"--device cuda:7: this machine has \d cuda device"):
            resolve_device("cuda:7")
    if not torch.cuda.is_available():
        with pytest.raises(SpecDecError, match="pass --device cpu or omit --device"):
            resolve_device("cuda")
