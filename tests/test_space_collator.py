"""SAR-SFT collator (SPACE, arXiv:2402.11809, §3.1 eq. 2-3, App. A.1) and mask-token setup (§4.1)."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.trainers.space.collator import SpaceDataCollator, mask_starts, sar_sample

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama

M, PAD, IGN = 99, 0, -100


def _sample(n_prompt: int = 6, n_answer: int = 14) -> dict:
    ids = list(range(10, 10 + n_prompt + n_answer))
    labels = [IGN] * n_prompt + ids[n_prompt:]
    return {"input_ids": ids, "labels": labels}


def test_sar_sample_masks_truncates_and_keeps_labels():
    s = _sample()
    ids, labels = sar_sample(s["input_ids"], s["labels"], k=3, mask_token_id=M, m=8)
    # inputs y_<m then k masks (eq. 2); one more position carries the label of the last mask
    assert ids == list(range(10, 18)) + [M, M, M] + [21]
    assert labels == s["labels"][:12]  # labels intact, truncated to m + k + 1
    # with the causal-LM shift: position m-1 -> y_m, mask i -> y_{m+i} (i = 1..k): k + 1 SAR terms
    scored = [labels[j + 1] for j in range(7, 11)]
    assert scored == [18, 19, 20, 21]


def test_mask_starts_only_inside_the_answer():
    s = _sample(n_prompt=6, n_answer=14)
    assert mask_starts(s["labels"], 5) == list(range(6, 16))  # m in {0..N-k} of the answer, N = 14
    assert mask_starts([IGN, 1, 2, IGN, 3, 4, 5], 3) == [4]  # never across a prompt token
    with pytest.raises(SpecDecError):
        sar_sample(s["input_ids"], s["labels"], k=3, mask_token_id=M, m=4)  # span touches the prompt


def test_p_ar_one_is_plain_sft():
    feats = [_sample(6, 14), _sample(3, 9)]
    batch = SpaceDataCollator(M, PAD, k=5, p_ar=1.0)(feats)
    assert batch["input_ids"].shape == (2, 20)
    assert batch["input_ids"][0].tolist() == feats[0]["input_ids"]
    assert batch["labels"][0].tolist() == feats[0]["labels"]
    assert batch["input_ids"][1].tolist() == feats[1]["input_ids"] + [PAD] * 8
    assert batch["labels"][1].tolist() == feats[1]["labels"] + [IGN] * 8
    assert batch["attention_mask"].sum(1).tolist() == [20, 12]
    assert not (batch["input_ids"] == M).any()


def test_p_ar_zero_always_masks_k_answer_tokens_uniformly():
    s = _sample(6, 14)
    col = SpaceDataCollator(M, PAD, k=5, p_ar=0.0, seed=1)
    seen = set()
    for _ in range(300):
        ids, labels = col.transform(s["input_ids"], s["labels"])
        where = [j for j, t in enumerate(ids) if t == M]
        m = where[0]
        assert where == list(range(m, m + 5)) and m >= 6  # k consecutive masks, none in the prompt
        assert len(ids) == len(labels) == min(m + 6, 20)
        assert labels == s["labels"][: len(labels)] and ids[:m] == s["input_ids"][:m]
        seen.add(m)
    assert seen == set(range(6, 16))  # every valid start is drawn


def test_mixture_and_short_answers():
    col = SpaceDataCollator(M, PAD, k=5, p_ar=0.5, seed=0)
    masked = sum(M in col.transform(**_sample())[0] for _ in range(400))
    assert 150 < masked < 250  # ~ (1 - p_ar) of the samples
    short = _sample(6, 4)  # answer shorter than k: stays AR
    assert col.transform(**short) == (short["input_ids"], short["labels"])
    with pytest.raises(SpecDecError):
        SpaceDataCollator(M, PAD, k=5, p_ar=1.5)


def test_trainer_runs_unchanged_with_the_collator(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = tiny_llama(vocab_size=100)
    ds = Dataset.from_list([_sample(6, 14), _sample(4, 20), _sample(8, 10), _sample(5, 15)])
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=SpaceDataCollator(M, PAD, k=3))
    out = trainer.train()
    assert out.global_step == 2 and torch.isfinite(torch.tensor(out.training_loss))


def test_mask_token_row_is_trained_through_lora_and_merged(tmp_path):
    """The added [M] row is trainable under LoRA (tied to the head), other rows frozen; merge keeps it."""
    from hf_specdec.trainers.space.train import apply_lora
    from transformers import AutoTokenizer

    from hf_specdec.space.mask_token import MASK_TOKEN, add_mask_token
    from hf_specdec.target import default_target_path

    tok = AutoTokenizer.from_pretrained(default_target_path())
    model = tiny_llama(vocab_size=len(tok), tie_word_embeddings=True)
    mask_id = add_mask_token(model, tok, k=3)
    assert mask_id == len(tok) - 1 and tok.convert_ids_to_tokens(mask_id) == MASK_TOKEN
    assert model.config.space_mask_token_id == mask_id and model.config.space_k == 3
    before = model.get_input_embeddings().weight.detach().clone()
    assert 0.005 < float(before[mask_id].std()) < 0.05  # N(0, initializer_range = 0.02)
    peft_model = apply_lora(model, mask_id, r=4, alpha=8)
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=1.0)
    ids = torch.tensor([[5, 6, mask_id, mask_id, 7, 8]])
    peft_model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    merged = peft_model.merge_and_unload()
    after = merged.get_input_embeddings().weight.detach()
    assert not torch.allclose(after[mask_id], before[mask_id])
    assert torch.equal(after[:mask_id], before[:mask_id])
    merged.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert again.config.space_k == 3 and torch.equal(
        again.get_input_embeddings().weight[mask_id], after[mask_id]
    )


def test_fixed_validation_samples_pass_through():
    col = SpaceDataCollator(M, PAD, k=3, p_ar=0.0, seed=0)
    fixed = col.fix([_sample(), _sample()])
    first = col(fixed)
    assert torch.equal(first["input_ids"], col(fixed)["input_ids"])  # same masks at every evaluation
    assert (first["input_ids"] == M).sum() == 6
