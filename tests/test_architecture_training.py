"""Training on tiny targets of six architectures (``tests/tiny_architectures.py``): a few steps of GLIDE and
EDD through ``DrafterTrainer`` and of SPACE's SAR-SFT (LoRA + the ``[M]`` row, ``trainers/space/train.py``) on each
lower the loss; the drafters' checkpoints reload with ``from_pretrained(..., target=target)`` and give the same
logits, the SPACE adapter loads onto its base (``load_space_model``) as the trained model and decodes losslessly.
Decoding: ``test_architectures.py``."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM
from hf_specdec.trainers.drafters.trainer import DrafterTrainer
from transformers import AutoModelForCausalLM, TrainingArguments

import hf_specdec

from .tiny_architectures import ARCHITECTURES, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64
DRAFTERS = {"glide": (GlideConfig, GlideForCausalLM), "edd": (EddConfig, EddForCausalLM)}


def _arguments(tmp_path, steps: int, lr: float) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=lr,
        lr_scheduler_type="constant",
        report_to=[],
        remove_unused_columns=False,
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )


def _rows(target, n: int = 4, length: int = 24) -> list[dict]:
    """Training rows: short prompts and the target's own greedy continuation (what ``corpus --regenerate`` trains
    drafters on), the prompt tokens left out of the loss."""
    prompts = torch.randint(3, VOCAB, (n, 6), generator=torch.Generator().manual_seed(0))
    ids = target.generate(prompts, max_new_tokens=length - 6, min_new_tokens=length - 6, do_sample=False)
    return [{"input_ids": row.tolist(), "labels": [-100] * 6 + row[6:].tolist()} for row in ids]


@pytest.mark.parametrize("kind", sorted(DRAFTERS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_drafter_trains_and_its_checkpoint_reloads(arch, kind, tmp_path):
    from datasets import Dataset

    target = tiny_target(arch, VOCAB)
    config_class, model_class = DRAFTERS[kind]
    torch.manual_seed(0)
    drafter = model_class(config_class.for_target(target)).attach_target(target)
    drafter.init_from_target(target)
    data = Dataset.from_list(_rows(target))
    trainer = DrafterTrainer(
        model=drafter,
        args=_arguments(tmp_path, 6, 3e-3),
        train_dataset=data,
        eval_dataset=data,
        target=target,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.05, (before, after)
    assert all(not p.requires_grad for p in target.parameters())  # the target stayed frozen

    drafter.eval().save_pretrained(tmp_path / "drafter")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "drafter", target=target).eval()
    assert type(back) is model_class and back.target is target
    ids = torch.tensor([data[0]["input_ids"]])
    with torch.no_grad():
        out = target.base_model(ids, **(drafter.target_forward_kwargs() or {}))
        logits = [m.draft_logits(m.hidden_states(ids, **m.target_context(out, ids))) for m in (drafter, back)]
    assert torch.equal(*logits)


def _tokenizer():
    """A word-level tokenizer over the tiny vocabulary (``t0`` .. ``t63``; pad, BOS, EOS, unknown: ids 0-3)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3"
    )


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_space_sar_sft_trains_and_its_adapter_loads_onto_the_base(arch, tmp_path):
    from datasets import Dataset
    from hf_specdec.trainers.space.card import write_model_card
    from hf_specdec.trainers.space.collator import SpaceDataCollator
    from hf_specdec.trainers.space.train import apply_lora
    from transformers import Trainer

    from hf_specdec.fingerprint import target_fingerprint
    from hf_specdec.space.adapter import load_space_model
    from hf_specdec.space.mask_token import add_mask_token

    base, tok = tiny_target(arch, VOCAB), _tokenizer()
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    rows = _rows(base, n=8)
    info = dict(base="tiny", k=3, p_ar=0.0, target_info=target_fingerprint(base), method="LoRA", batch=4)
    info["mask_token_id"] = mask_id = add_mask_token(base, tok, k=3)
    linear = {  # before apply_lora, which wraps the layers of `base` in place
        name.rsplit(".", 1)[-1]
        for name, m in base.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in name
    }
    model = apply_lora(base, mask_id, r=8, alpha=16, dropout=0.0)
    adapted = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if hasattr(m, "lora_A")}
    assert adapted and linear <= adapted, (adapted, linear)  # every projection of the layers gets an adapter

    collator = SpaceDataCollator(mask_id, tok.pad_token_id, k=3, p_ar=0.0, seed=0)
    data = Dataset.from_list(collator.fix(rows))
    trainer = Trainer(
        model=model,
        args=_arguments(tmp_path, 8, 1e-2),
        train_dataset=data,
        eval_dataset=data,
        data_collator=collator,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.05, (before, after)

    model.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)  # as `train space` saves it
    write_model_card(tmp_path / "adapter", dict(info, steps=8), adapter=True)
    trained = model.merge_and_unload().eval()
    loaded, _ = load_space_model("fp32", tmp_path / "adapter", base=tmp_path / "base")
    ids = torch.tensor([rows[0]["input_ids"][:10] + [mask_id] * 3])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, trained(ids).logits, rtol=0, atol=1e-5)
    prompt = torch.tensor([rows[1]["input_ids"][:12]])
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    out = loaded.generate(prompt, custom_generate=hf_specdec.space, **kw)
    assert torch.equal(out, loaded.generate(prompt, **kw))
