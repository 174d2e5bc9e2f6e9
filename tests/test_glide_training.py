"""DrafterTrainer on real data: a few GLIDE training steps on ShareGPT lower the loss on that data."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM
from hf_specdec.trainers.drafters.trainer import DrafterTrainer


@pytest.mark.real
@pytest.mark.slow
def test_training_steps_lower_the_loss_on_real_data(real_target, tmp_path):
    from datasets import Dataset
    from hf_specdec.trainers.data.chat import packed_dataset
    from transformers import TrainingArguments

    model, tok = real_target
    data = packed_dataset(tok, "train", block_size=64, limit=2)
    data = Dataset.from_list([data[0], data[1]])
    drafter = GlideForCausalLM(GlideConfig.for_target(model, draft_vocab_size=2048)).attach_target(model)
    drafter.init_from_target(model)
    drafter.set_draft_vocab(torch.arange(2048))
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        report_to=[],
        remove_unused_columns=False,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = DrafterTrainer(model=drafter, args=args, train_dataset=data, eval_dataset=data, target=model)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.1, (before, after)
    assert all(not p.requires_grad for p in model.parameters())  # the target stayed frozen


def test_expected_acceptance_hand_computation():
    """GLIDE (arXiv:2402.02082) §5's alpha: sum_x min(P_t(x), P_d(x)) per position, over a reduced draft vocabulary too."""
    from hf_specdec.trainers.drafters.losses import expected_acceptance

    target = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]))
    draft = torch.log(torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]))
    torch.testing.assert_close(expected_acceptance(target, draft), torch.tensor([0.7, 1.0]))
    # a drafter over tokens {0, 2} only (P_d = 0.5, 0.5): min(0.5, 0.5) + min(0.2, 0.5)
    subset = torch.log(torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(
        expected_acceptance(target[:1], subset, torch.tensor([0, 2])), torch.tensor([0.7])
    )
    with pytest.raises(ValueError, match="shapes differ"):
        expected_acceptance(target, subset)


def test_stop_at_step_stops_and_saves():
    from types import SimpleNamespace

    from hf_specdec.trainers.run_support import TimeLimitCallback
    from transformers import TrainerControl

    cb = TimeLimitCallback(None, stop_at_step=3)
    cb.on_train_begin(None, None, TrainerControl())
    for step, stops in ((1, False), (2, False), (3, True)):
        control = cb.on_step_end(None, SimpleNamespace(global_step=step), TrainerControl())
        assert control.should_training_stop == stops and control.should_save == stops
    never = TimeLimitCallback(None)  # neither limit set: never stops
    never.on_train_begin(None, None, TrainerControl())
    assert not never.on_step_end(
        None, SimpleNamespace(global_step=10**6), TrainerControl()
    ).should_training_stop


def _tiny_drafter(kind: str):
    """A tiny random target and an EDD / GLIDE / vanilla drafter attached to it, in eval mode."""
    from hf_specdec.modeling import EddConfig, EddForCausalLM

    from tests.conftest import tiny_llama

    target = tiny_llama(num_hidden_layers=4)
    torch.manual_seed(0)
    if kind == "edd":
        drafter = EddForCausalLM(EddConfig.for_target(target))
    else:
        drafter = GlideForCausalLM(GlideConfig.for_target(target, cross_attention=kind == "glide"))
    return target, drafter.attach_target(target).eval()


def _eval_trainer(tmp_path, target, drafter, rows: list[dict]) -> DrafterTrainer:
    from datasets import Dataset
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=2,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=True,
        disable_tqdm=True,
    )
    return DrafterTrainer(model=drafter, args=args, eval_dataset=Dataset.from_list(rows), target=target)


@pytest.mark.parametrize("kind", ["edd", "glide", "vanilla"])
def test_validation_reports_the_other_context_control(tmp_path, kind):
    """``eval_top1_other_context``: the drafter reads the target's states of another row of the batch."""
    from datasets import Dataset

    target, drafter = _tiny_drafter(kind)
    ids = torch.randint(3, 90, (2, 24))
    rows = [{"input_ids": r.tolist(), "labels": r.tolist()} for r in ids]
    trainer = _eval_trainer(tmp_path, target, drafter, rows)
    metrics = trainer.evaluate()
    if kind == "vanilla":  # reads nothing from the target: no control
        assert "eval_top1_other_context" not in metrics
        return
    assert 0.0 < metrics["eval_alpha"] <= 1.0
    assert 0.0 <= metrics["eval_top1_other_context"] <= 1.0
    same = trainer.evaluate(Dataset.from_list([rows[0], rows[0]]))  # the other row is the same text
    assert same["eval_top1_other_context"] == same["eval_top1_match"]
    with torch.no_grad():
        real = trainer._forward(drafter, ids, ids, need_target_logits=False)["logits"]
        again = trainer._forward(drafter, ids, ids, need_target_logits=False, context_ids=ids.clone())[
            "logits"
        ]
        other = trainer._forward(drafter, ids, ids, need_target_logits=False, context_ids=ids.roll(1, 0))[
            "logits"
        ]
    torch.testing.assert_close(again, real)
    assert not torch.allclose(other, real, atol=1e-4)


@pytest.mark.parametrize("kind", ["edd", "glide"])
def test_round_start_match_counts_exactly_the_first_position_of_each_later_round(tmp_path, kind):
    from datasets import Dataset

    target, drafter = _tiny_drafter(kind)
    L = drafter.round_length()
    assert L == 5
    ids = torch.randint(3, 90, (2, 23))
    # supervise the tokens predicted from round starts j = L, 2L, ... (label index j + 1), plus j = 0 (the first
    # round: no target context, not counted) and j = 3 (inside a round)
    rows = []
    for r in ids:
        labels = [-100] * len(r)
        for j in [0, 3, *range(L, len(r) - 1, L)]:
            labels[j + 1] = int(r[j + 1])
        rows.append({"input_ids": r.tolist(), "labels": labels})
    trainer = _eval_trainer(tmp_path, target, drafter, rows)
    m = trainer.evaluate()
    assert m["eval_tokens"] == 2 * 6  # j = 0, 3, 5, 10, 15, 20 in each row
    labels = torch.tensor([row["labels"] for row in rows])
    with torch.no_grad():
        r = trainer._forward(drafter, ids, labels, need_target_logits=True)
    hit = r["logits"].argmax(-1) == r["target_argmax"]  # in row order: j = 0, 3, 5, 10, 15, 20 per row
    starts = torch.tensor([j in (5, 10, 15, 20) for j in [0, 3, 5, 10, 15, 20] * 2])
    assert m["eval_top1_round_start"] == pytest.approx(hit[starts].float().mean().item())
    for row in rows:  # only positions inside rounds (and the first round) supervised: no round start counted
        row["labels"] = [tok if i in (1, 4) else -100 for i, tok in enumerate(row["labels"])]
    assert "eval_top1_round_start" not in trainer.evaluate(Dataset.from_list(rows))


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_bf16_mixed_precision_trains_and_saves_an_fp32_checkpoint(real_target, tmp_path, kind):
    """Issue #32: bf16 autocast (the default where the CPU runs bf16 natively) lowers the loss on real data, keeps
    fp32 weights, and the checkpoint loads in fp32 with the logits it was saved with."""
    from datasets import Dataset
    from hf_specdec.modeling import EddConfig, EddForCausalLM
    from hf_specdec.trainers.data.chat import packed_dataset
    from transformers import AutoModelForCausalLM, TrainingArguments

    model, tok = real_target
    data = packed_dataset(tok, "train", block_size=64, limit=2)
    data = Dataset.from_list([data[0], data[1]])
    torch.manual_seed(0)
    if kind == "edd":
        drafter = EddForCausalLM(EddConfig.for_target(model, draft_vocab_size=2048)).attach_target(model)
    else:
        drafter = GlideForCausalLM(GlideConfig.for_target(model, draft_vocab_size=2048)).attach_target(model)
    drafter.init_from_target(model)
    drafter.set_draft_vocab(torch.arange(2048))
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, learning_rate=2e-3,
        lr_scheduler_type="constant", report_to=[], remove_unused_columns=False, save_strategy="no",
        use_cpu=True, disable_tqdm=True, bf16=True,
    )  # fmt: skip
    trainer = DrafterTrainer(
        model=drafter, args=args, train_dataset=data, eval_dataset=data, target=model, loss="kl"
    )  # the recipes' loss: the target's distribution is the teacher
    before = trainer.evaluate()["eval_loss"]
    # what ran in bf16 during the steps: the frozen target's layers and its LM head (the teacher), not only the
    # drafter's forward, which is all the Trainer puts under autocast by itself
    dtypes: dict[str, set] = {"target layer": set(), "target head": set()}
    hooks = [
        module.register_forward_hook(lambda m, i, out, key=key: dtypes[key].add(out.dtype))
        for key, module in (
            ("target layer", model.model.layers[3].mlp.down_proj),
            ("target head", model.lm_head),
        )
    ]
    trainer.train()
    for hook in hooks:
        hook.remove()
    assert dtypes == {"target layer": {torch.bfloat16}, "target head": {torch.bfloat16}}
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.1, (before, after)
    assert all(p.dtype == torch.float32 for p in drafter.parameters())  # autocast: fp32 master weights
    drafter.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path / "saved", target=model, dtype=torch.float32
    ).eval()
    assert next(loaded.parameters()).dtype == torch.float32
    saved = (
        loaded.state_dict()
    )  # every trained weight, exactly (accelerate leaves `drafter.forward` under autocast)
    for name, value in drafter.state_dict().items():
        torch.testing.assert_close(saved[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("native", [True, False])
def test_precision_auto_is_bf16_only_where_native(monkeypatch, native):
    from types import SimpleNamespace

    from hf_specdec.trainers.run_support import mixed_precision_bf16

    from hf_specdec import machine

    monkeypatch.setattr(machine, "cpu_has_native_bf16", lambda flags=None: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mixed_precision_bf16(SimpleNamespace(precision="auto")) is native
    assert mixed_precision_bf16(SimpleNamespace(precision="fp32")) is False
    assert mixed_precision_bf16(SimpleNamespace(precision="bf16")) is True
    assert mixed_precision_bf16(SimpleNamespace()) is False  # a programmatic Namespace: fp32 as before


def test_training_clis_default_to_precision_auto():
    import argparse

    from hf_specdec.trainers.drafters.options import add_job_arguments
    from hf_specdec.trainers.space.train import add_arguments

    for add in (add_job_arguments, add_arguments):
        p = argparse.ArgumentParser()
        add(p)
        known, _ = p.parse_known_args(["--output-dir", "o"])
        assert known.precision == "auto"
        assert p.parse_known_args(["--output-dir", "o", "--bf16"])[0].precision == "bf16"


def test_every_training_run_resumes_by_one_policy(tmp_path):
    """``run_support.resume_point``, shared by ``train glide|edd|space``: by default the last checkpoint if there is
    one; ``--resume`` requires one; ``--no-resume`` refuses a folder holding one (it would rotate it away)."""
    import argparse

    from hf_specdec.trainers.drafters import edd, glide
    from hf_specdec.trainers.run_support import resume_point
    from hf_specdec.trainers.space import train as space

    from hf_specdec.errors import SpecDecError

    assert resume_point(tmp_path / "absent", None) is None and resume_point(tmp_path, False) is None
    with pytest.raises(SpecDecError, match="no checkpoint-\\* folder .* drop --resume"):
        resume_point(tmp_path, True)
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert resume_point(tmp_path, None) == resume_point(tmp_path, True) == str(tmp_path / "checkpoint-10")
    with pytest.raises(SpecDecError, match="holds checkpoint-10 of an earlier run: drop --no-resume"):
        resume_point(tmp_path, False)
    for recipe in (glide, edd, space):  # the three CLIs parse the flag alike
        p = argparse.ArgumentParser()
        recipe.add_arguments(p)
        parsed = [
            p.parse_known_args(["--output-dir", "o", *flag])[0].resume
            for flag in ([], ["--resume"], ["--no-resume"])
        ]
        assert parsed == [None, True, False]


def test_validation_holds_the_asked_supervised_tokens():
    """Issue #32: validation blocks are taken until they hold --eval-tokens supervised tokens (or the split ends)."""
    from datasets import Dataset
    from hf_specdec.trainers.data.rows import validation_blocks

    asked = []

    def blocks(split, limit):  # 10 blocks of 8 tokens, 3 of them supervised each
        asked.append((split, limit))
        rows = [{"input_ids": [1] * 8, "labels": [-100] * 5 + [7] * 3} for _ in range(min(limit, 10))]
        return Dataset.from_list(rows)

    assert len(validation_blocks(blocks, 10, 8)) == 4  # 4 x 3 = 12 >= 10 supervised tokens
    assert asked[0] == ("validation", 3)  # first guess 2 x 10 / 8 blocks, then doubled until enough
    assert len(validation_blocks(blocks, 1000, 8)) == 10  # fewer in the split: all of it


def test_kl_of_a_batch_without_supervised_positions_is_a_zero_loss():
    """A batch whose blocks hold no assistant token (a long prompt) adds nothing under loss 'kl' (it stopped the run:
    "needs the target's distribution"); a batch with no teacher at all still has no KL."""
    logits = torch.zeros(0, 8, requires_grad=True)
    kl = DrafterTrainer._kl(None, {"logits": logits, "target_logits": torch.zeros(0, 8), "n": 0})
    assert kl is not None and float(kl) == 0.0 and kl.requires_grad
    assert DrafterTrainer._kl(None, {"logits": logits, "n": 0}) is None
