"""SAR-SFT adapters (``hf_specdec.space.adapter``): a LoRA adapter + SPACE's card loads onto its base as the merged
model, the wrong base or a broken folder fails clearly, bench and demo decode a SAR-SFT model of SPACE's own (the
shipped adapter by default) when the target is not one, and the shipped adapter itself decodes losslessly on the
default target."""

from __future__ import annotations

import json

import pytest
import torch

import hf_specdec
from hf_specdec.errors import SpecDecError
from hf_specdec.space.adapter import (
    SHIPPED_ADAPTER,
    is_space_adapter,
    load_model,
    load_space_model,
)

from .conftest import tiny_llama


def _base_and_adapter(tmp_path, seed: int = 0):
    """A tiny base model folder (the default target's tokenizer) and a SAR-SFT adapter trained one SGD step on it,
    written as ``train space`` writes one; returns both folders and the merged model the adapter must give."""
    from hf_specdec.trainers.space.card import write_model_card
    from hf_specdec.trainers.space.train import apply_lora
    from transformers import AutoTokenizer

    from hf_specdec.fingerprint import target_fingerprint
    from hf_specdec.space.mask_token import add_mask_token
    from hf_specdec.target import default_target_path

    tok = AutoTokenizer.from_pretrained(default_target_path())
    base = tiny_llama(vocab_size=len(tok), seed=seed, tie_word_embeddings=True)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    info = {"base": "tiny", "k": 3, "p_ar": 0.5, "target_info": target_fingerprint(base)}
    info["mask_token_id"] = mask_id = add_mask_token(base, tok, k=3)
    peft_model = apply_lora(base, mask_id, r=4, alpha=8, dropout=0.0)
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=1.0)
    ids = torch.tensor([[5, 6, mask_id, mask_id, 7, 8]])
    peft_model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    peft_model.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)  # as `train space` saves it
    info.update(method="LoRA r=4 + trainable [M] row", steps=1, batch=1)
    write_model_card(tmp_path / "adapter", info, adapter=True)
    return tmp_path / "base", tmp_path / "adapter", peft_model.merge_and_unload().eval()


def test_adapter_loads_as_the_merged_model(tmp_path):
    from hf_specdec.space.mask_token import add_mask_token
    from hf_specdec.target import load_target

    base, adapter, merged = _base_and_adapter(tmp_path)
    assert is_space_adapter(adapter) and not is_space_adapter(base)
    model, tok = load_space_model("fp32", adapter, base=base)
    mask_id = model.config.space_mask_token_id
    assert (mask_id, model.config.space_k) == (len(tok) - 1, 3)
    from safetensors import safe_open

    with safe_open(
        adapter / "adapter_model.safetensors", "pt"
    ) as f:  # the [M] row, not whole embedding matrices
        assert all(f.get_slice(k).get_shape()[0] < 1000 for k in f.keys() if "lora" not in k)
    ids = torch.tensor([[5, 6, 7, mask_id, mask_id, 9]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, merged(ids).logits, rtol=0, atol=1e-5)
        plain, plain_tok = load_target(base)  # the base with a fresh [M] row, no adapter: other logits
        add_mask_token(plain, plain_tok, k=3)
        assert not torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-3)
    card = (adapter / "README.md").read_text()
    assert "library_name: peft" in card and "load_space_model" in card


def test_adapter_refuses_another_base_and_broken_folders(tmp_path):
    _, adapter, _ = _base_and_adapter(tmp_path / "a", seed=0)
    other, _, _ = _base_and_adapter(tmp_path / "b", seed=1)
    with pytest.raises(SpecDecError, match="SPACE adapter .* was built for target"):
        load_space_model("fp32", adapter, base=other)
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(SpecDecError, match="not a SPACE adapter .*missing adapter_model.safetensors"):
        load_space_model("fp32", adapter, base=other)
    card = json.loads((tmp_path / "b" / "adapter" / "space_training.json").read_text())
    card["mask_token_id"] += 1
    (tmp_path / "b" / "adapter" / "space_training.json").write_text(json.dumps(card))
    with pytest.raises(SpecDecError, match="mask token at id"):
        load_space_model("fp32", tmp_path / "b" / "adapter", base=other)


def test_the_card_sets_the_masks_per_step_decoding_uses(tmp_path):
    """``decode_masks`` on an adapter's card becomes the model's decoding default (explicit ``num_masks`` wins);
    without it SPACE feeds all k trained masks; a value outside 1..k is refused at load."""
    from hf_specdec.space.decoding import _space_config

    base, adapter, _ = _base_and_adapter(tmp_path)
    model, _ = load_space_model("fp32", adapter, base=base)
    assert getattr(model.config, "space_num_masks", None) is None and _space_config(model, None, None)[0] == 3
    card_path = adapter / "space_training.json"
    card = json.loads(card_path.read_text())
    card_path.write_text(json.dumps(dict(card, decode_masks=2)))
    model, _ = load_space_model("fp32", adapter, base=base)
    assert model.config.space_num_masks == 2 and _space_config(model, None, None)[0] == 2
    assert _space_config(model, 3, None)[0] == 3
    for bad in (0, 4, "1", True):
        card_path.write_text(json.dumps(dict(card, decode_masks=bad)))
        with pytest.raises(SpecDecError, match="decode_masks=.* from 1 to its trained k = 3"):
            load_space_model("fp32", adapter, base=base)


def test_bench_space_decodes_a_sar_sft_model_of_its_own_unless_the_target_is_one(tmp_path):
    """The bench's (and demo's) ``space`` method: on a SAR-SFT target it decodes the target; on a plain one it loads
    ``--option space_model`` (default: the shipped adapter) as a model of its own when no --model was given or the
    option names one, and refuses an explicit --model that is not a SAR-SFT model at set-up, saying what to do."""
    from hf_specdec.bench.methods import AutoRegressive, BenchContext, get_method
    from hf_specdec.bench.own_models import OwnModels, setup_runners

    base, adapter, _ = _base_and_adapter(tmp_path)
    plain, tok = load_model(str(base))  # a plain model folder still goes through load_target
    assert getattr(plain.config, "space_mask_token_id", None) is None
    sar, sar_tok = load_space_model("fp32", adapter, base=base)
    sar.save_pretrained(tmp_path / "merged")
    sar_tok.save_pretrained(tmp_path / "merged")
    space = get_method("space")

    on_sar = space()
    on_sar.setup(BenchContext(sar, sar_tok, "fp32", model_name=str(tmp_path / "merged")))
    assert on_sar.model is sar and on_sar.model_source is None

    for model_name in (None, str(base)):  # the option names the SAR-SFT model: with or without --model
        ctx = BenchContext(
            plain, tok, "fp32", {"space_model": str(tmp_path / "merged")}, model_name=model_name
        )
        runners = setup_runners(["ar", "space"], [AutoRegressive, space], ctx)
        assert runners["ar"].model is plain and runners["space"].model is not plain
        assert runners["space"].model.config.space_mask_token_id == sar.config.space_mask_token_id
        own = OwnModels(runners, plain, ctx)
        assert "space" in own and "ar" not in own and own.sources == {"space": str(tmp_path / "merged")}

    with pytest.raises(
        SpecDecError,
        match=r"^--model .*base is not a SAR-SFT model .*--option space_model=DIR/final \(or --model DIR/final\)$",
    ) as err:
        setup_runners(
            ["ar", "space"], [AutoRegressive, space], BenchContext(plain, tok, "fp32", model_name=str(base))
        )
    assert "cannot serve" not in str(err.value)  # one message, not wrapped twice
    assert SHIPPED_ADAPTER.is_dir()  # what space decodes without --model and option


@pytest.mark.real
@pytest.mark.slow
def test_the_shipped_adapter_is_lossless_and_drafts(real_target):
    """The shipped SAR-SFT adapter on the default target: SPACE's greedy output is plain greedy's, and its mask
    guesses are accepted (tau > 1), so the shipped weights are trained, not a fresh mask row."""
    from hf_specdec.core.stats import DecodeStats
    from hf_specdec.tasks import load_task

    assert is_space_adapter(SHIPPED_ADAPTER)
    model, tok = load_space_model(dtype="fp32")
    card = json.loads((SHIPPED_ADAPTER / "space_training.json").read_text())
    assert model.config.space_k == card["k"] and model.config.space_mask_token_id == card["mask_token_id"]
    assert model.config.space_num_masks == card["decode_masks"] == 1  # measured fastest (card, docs/space.md)
    for task in ("mt-bench", "code-edit"):
        ids = tok(load_task(task, tok, 1)[0]["prompt"], return_tensors="pt").input_ids
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False)
        stats = DecodeStats()
        # every candidate verified (the paper's rule): the cost rule may verify none on a machine where a wider
        # forward costs more than the adapter's guesses return, which would say nothing about the weights
        out = model.generate(ids, custom_generate=hf_specdec.space, stats=stats, space_cost=False, **kw)
        assert torch.equal(out, model.generate(ids, **kw))
        assert stats.accepted > 0 and stats.new_tokens > stats.target_forwards


def test_the_packaged_adapter_card_names_its_base_and_command(tmp_path):
    """The shipped card is a Hub card for a peft adapter of the default target, records how it was made, and is what
    the card writer makes of its figures (regenerating it changes nothing)."""
    from hf_specdec.trainers.space.card import write_model_card
    from huggingface_hub import ModelCard

    from hf_specdec.target import DEFAULT_TARGET_HUB_ID, DEFAULT_TARGET_NAME

    card = ModelCard.load(SHIPPED_ADAPTER / "README.md")
    assert card.data.library_name == "peft" and card.data.base_model == DEFAULT_TARGET_HUB_ID
    info = json.loads((SHIPPED_ADAPTER / "space_training.json").read_text())
    assert info["target_info"]["name"] == DEFAULT_TARGET_NAME and info["p_ar"] < 1
    assert (
        info["command"].startswith("hf-specdec train space")
        and f"{info['steps']} x {info['batch']}" in card.text
    )
    config = json.loads((SHIPPED_ADAPTER / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["trainable_token_indices"]
    assert config["base_model_name_or_path"] == DEFAULT_TARGET_HUB_ID
    write_model_card(tmp_path, info, adapter=True)
    assert (tmp_path / "README.md").read_text() == (SHIPPED_ADAPTER / "README.md").read_text()
    assert (
        "load_space_model(adapter=FOLDER)" in card.text and DEFAULT_TARGET_HUB_ID in card.text.split("|")[0]
    )


@pytest.mark.real
@pytest.mark.slow
def test_train_space_writes_an_adapter_that_loads_as_its_merged_model(real_target, tmp_path, capsys):
    """`hf-specdec train space` (LoRA, merged) also writes OUTPUT/adapter with its card; loaded onto the default
    target it is the merged OUTPUT/final, and the card records the base's fingerprint, the command and the data
    (here a token corpus, as `--corpus` of `hf-specdec corpus --regenerate` is read); both decode with the
    `--decode-masks` it was given."""
    from hf_specdec.trainers.data.tokenized import SHAREGPT_SOURCE, build_corpus

    from hf_specdec.cli import main
    from hf_specdec.target import load_target

    build_corpus(real_target[1], tmp_path / "corpus", limit_conversations=8)
    out = tmp_path / "run"
    argv = ["train", "space", "--output-dir", str(out), "--max-steps", "1", "--batch-size", "2"]
    argv += ["--corpus", str(tmp_path / "corpus")]
    argv += ["--max-length", "48", "--eval-samples", "2", "--tau-prompts", "0", "--k", "3", "--lr", "1e-2"]
    # more masks per step than it trains: refused before loading
    assert main([*argv, "--decode-masks", "4"]) == 2
    assert "--decode-masks from 1 to k" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--decode-masks", "2"]) in (0, None)
    assert is_space_adapter(out / "adapter")
    # a fresh run over its checkpoint is refused before the model loads (trainers/run_support.resume_point)
    assert main([*argv, "--no-resume", "--model", str(tmp_path / "missing")]) == 2
    assert "holds checkpoint-1 of an earlier run" in capsys.readouterr().err
    assert (out / "adapter" / "adapter_model.safetensors").stat().st_size < 30e6  # LoRA + the [M] row only
    info = json.loads((out / "adapter" / "space_training.json").read_text())
    assert info["command"].startswith("hf-specdec train space") and info["target_info"]["vocab_size"] == 49152
    assert info["data"] == f"{SHAREGPT_SOURCE}: first turns"
    assert f"| data | {SHAREGPT_SOURCE}: first turns |" in (out / "adapter" / "README.md").read_text()
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    merged, tok = load_target(out / "final", "fp32")
    loaded, _ = load_space_model("fp32", out / "adapter")
    ids = torch.tensor([[1, 2, 3, merged.config.space_mask_token_id, 5]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, merged(ids).logits, rtol=0, atol=1e-4)
    assert info["decode_masks"] == merged.config.space_num_masks == loaded.config.space_num_masks == 2
    scores = info["mask_top1"]  # the masks' held-out top-1 (trainers/space/eval.py), one figure per mask
    assert (
        len(scores["masks"]) == 3
        and scores["spans"] > 0
        and all(0 <= x <= 1 for x in [scores["ar"], *scores["masks"]])
    )
    assert "| held-out top-1: next token / masks 1..k |" in (out / "adapter" / "README.md").read_text()


@pytest.mark.real
@pytest.mark.slow
def test_bench_space_without_model_runs_the_shipped_adapter(tmp_path):
    """`hf-specdec bench --methods ar,space` on a fresh machine: no --model, so `ar` runs the default target and
    `space` the shipped SAR-SFT model, lossless against plain generate of those weights."""
    from hf_specdec.bench.harness import run_bench

    results = run_bench(["ar", "space"], ["mt-bench"], limit=1, max_new_tokens=16, out=tmp_path)
    assert results["config"]["own_models"] == {"space": str(SHIPPED_ADAPTER)}
    assert results["config"]["model"].startswith(
        "default (SmolLM2-135M-Instruct) for every method but `space`, which"
    )
    space = next(r for r in results["runs"] if r["method"] == "space")
    assert space["lossless"] and space["tau"] >= 1.0
