"""Confidence calibration for PCT (trainers/drafters/calibration.py): the temperature fit, the ECE, the trees reading
the calibrated confidences, and ``hf-specdec calibrate`` on the shipped EDD."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hf_specdec.trainers.drafters.calibration import (
    CARD_SECTION,
    calibrate,
    fit_temperature,
    temperature_nll,
    top1_ece,
)


def test_fit_recovers_the_temperature_the_labels_were_drawn_at():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, 12, generator=g) * 2.0
    for true_t in (0.6, 1.0, 1.7):
        gold = torch.multinomial((logits / true_t).softmax(-1), 1, generator=g).squeeze(1)
        t = fit_temperature(logits, gold)
        assert t == pytest.approx(true_t, rel=0.06), (true_t, t)
        assert temperature_nll(logits, gold, t) <= temperature_nll(logits, gold, 1.0) + 1e-6


def test_top1_ece_hand_computation():
    # two rows at confidence 0.9 (one right, one wrong): |0.9 - 0.5| with weight 1/2; one at 0.35, right:
    # |0.35 - 1| with weight 1/4; one at 0.35, wrong: same bin, so that bin is |0.35 - 0.5| with weight 1/2
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.35, 0.65], [0.65, 0.35]])
    # top-1 confidences: 0.9, 0.9, 0.65, 0.65; top-1 tokens 0, 0, 1, 0
    gold = torch.tensor([0, 1, 1, 1])
    expected = 0.5 * abs(0.9 - 0.5) + 0.5 * abs(0.65 - 0.5)
    assert top1_ece(probs, gold) == pytest.approx(expected)


def test_calibrate_leaves_out_tokens_outside_the_draft_vocabulary():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(400, 3, generator=g)
    gold = logits.argmax(-1)  # the target's token, as a draft column
    gold[:100] = -100  # not in the draft vocabulary (the drafter's to_draft_ids)
    result = calibrate(logits, gold)
    assert result["tokens"] == 300
    # the target always takes the drafter's argmax: calibration sharpens (T < 1) and the ECE drops
    assert result["temperature"] < 1.0
    assert result["top1_ece"][1] < result["top1_ece"][0]
    assert result["nll"][1] < result["nll"][0]


def test_trees_read_confidences_at_the_drafters_temperature(target_and_edd, tmp_path):
    from hf_specdec.modeling import EddConfig, EddForCausalLM

    from hf_specdec.edd.draft_state import EddDraftState
    from hf_specdec.edd.tree_proposer import EddTreeProposer

    target, edd = target_and_edd
    edd.attach_target(target)
    ids = torch.randint(3, 90, (1, 7))
    with torch.no_grad():
        h = target.base_model(ids[:, :-1], output_hidden_states=True).hidden_states[edd.config.encoder_layer]
        state = EddDraftState(edd)
        state.push_hidden(h)
        raw = EddTreeProposer(edd, "pct", confidence_temperature=1.0).expander(state, ids).expand([-1], None)
        state = EddDraftState(edd)
        state.push_hidden(h)
        sharp = (
            EddTreeProposer(edd, "pct", confidence_temperature=0.5).expander(state, ids).expand([-1], None)
        )
    torch.testing.assert_close(sharp, (raw.log() / 0.5).softmax(-1), rtol=1e-4, atol=1e-7)
    # the default is the drafter's calibrated temperature, which survives save / load
    edd.config.confidence_temperature = 0.5
    try:
        edd.save_pretrained(tmp_path)
        loaded = EddForCausalLM.from_pretrained(tmp_path, target=target)
        assert loaded.config.confidence_temperature == 0.5
        assert EddTreeProposer(loaded, "pct").expander(EddDraftState(loaded), ids).temperature == 0.5
    finally:
        edd.config.confidence_temperature = 1.0
    with pytest.raises(Exception, match="confidence_temperature must be > 0"):
        EddConfig.for_target(target, confidence_temperature=0.0)
    with pytest.raises(Exception, match="confidence_temperature must be > 0"):
        EddTreeProposer(edd, "pct", confidence_temperature=-1.0)


def test_pct_with_a_temperature_stays_lossless(target_and_edd):
    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer

    target, edd = target_and_edd
    kw = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    ids = torch.randint(3, 90, (1, 8))
    for t in (0.5, 2.0):
        proposer = EddTreeProposer(edd, "pct", ratio=0.05, confidence_temperature=t)
        out = target.generate(ids, custom_generate=tree_generate, proposer=proposer, **kw)
        assert torch.equal(out, target.generate(ids, **kw))


@pytest.mark.real
def test_calibrate_command_on_the_shipped_edd(tmp_path, capsys):
    from hf_specdec.modeling.edd import EddConfig

    from hf_specdec.cli import main
    from hf_specdec.shipped import RESOURCES

    folder = tmp_path / "edd"
    shutil.copytree(RESOURCES / "edd-smollm2", folder)
    before = json.loads((folder / "config.json").read_text())
    readme = (folder / "README.md").read_text()
    for _ in range(2):  # a second run replaces the first one's record
        assert main(["calibrate", "--drafter", str(folder), "--blocks", "2", "--block-size", "64"]) == 0
    t = EddConfig.from_pretrained(folder).confidence_temperature
    assert 0.25 <= t <= 4.0 and t != 1.0
    after = json.loads((folder / "config.json").read_text())
    assert {k: v for k, v in after.items() if k != "confidence_temperature"} == {
        k: v for k, v in before.items() if k != "confidence_temperature"
    }
    assert "confidence temperature" in json.loads((folder / "model_card.json").read_text())["calibration"]
    card = (folder / "README.md").read_text()
    assert card.count(CARD_SECTION) == 1 and "confidence temperature" in card.split(CARD_SECTION)[1]
    assert card.startswith(readme.split(CARD_SECTION)[0].rstrip("\n"))  # the rest of the card is kept
    capsys.readouterr()
    assert main(["calibrate", "--drafter", str(tmp_path / "nothing")]) == 2
    assert "no config.json there" in capsys.readouterr().err
    glide = tmp_path / "glide"
    glide.mkdir()
    (glide / "config.json").write_text(json.dumps({"model_type": "glide"}))
    assert main(["calibrate", "--drafter", str(glide)]) == 2
    assert "calibrate fits EDD drafters" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.slow
def test_train_edd_ends_calibrated_and_records_it(tmp_path, capsys):
    """`hf-specdec train edd` (2 steps on real data) fits the temperature, saves it and puts it on the card."""
    from hf_specdec.modeling.edd import EddConfig

    from hf_specdec.cli import main
    from hf_specdec.machine import describe_machine, machine_line

    out = tmp_path / "edd"
    argv = [
        "train",
        "edd",
        "--output-dir",
        str(out),
        "--max-steps",
        "2",
        "--block-size",
        "64",
        "--batch-size",
        "2",
    ]
    argv += ["--eval-blocks", "2", "--eval-length", "256", "--eval-steps", "2", "--save-steps", "2"]
    argv += ["--measure-prompts", "0"]
    assert main([*argv, "--draft-vocab", "1024"]) == 0
    t = EddConfig.from_pretrained(out).confidence_temperature
    assert 0.25 <= t <= 4.0 and t != 1.0
    info = json.loads((out / "model_card.json").read_text())
    card = info["calibration"]
    assert card.startswith(f"confidence temperature {t:g} ")
    assert card in (out / "README.md").read_text()
    rows = "held-out conversations, first 256 tokens each"  # --eval-context conversation, the default
    assert info["validation_rows"] == rows and f"ShareGPT ({rows})" in (out / "README.md").read_text()
    cost = info["cost"]  # the drafter's c in fp32 and bf16, and the machine it was timed on, on the card too
    # the machine line names this CPU's bf16 answer, whichever it is ("native bf16 (...)" or "no native bf16")
    assert cost["fp32"] > 0 and cost["bf16"] > 0 and cost["machine"] == machine_line(describe_machine())
    assert (
        f"| fp32 {cost['fp32']}, bf16 {cost['bf16']}, machine {cost['machine']} |"
        in (out / "README.md").read_text()
    )
    # the run saved checkpoint-2: a fresh run there (--no-resume) stops before anything loads, and keeps it; the
    # same command without it goes on from step 2 (a stopped run loses at most a few minutes)
    weights = (out / "checkpoint-2" / "model.safetensors").read_bytes()
    assert main([*argv, "--draft-vocab", "1024", "--no-resume", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert (
        "holds checkpoint-2 of an earlier run: drop --no-resume to continue it" in err
        and "missing" not in err
    )
    assert (out / "checkpoint-2" / "model.safetensors").read_bytes() == weights
    argv[argv.index("--max-steps") + 1] = "3"
    assert main([*argv, "--draft-vocab", "1024", "--no-card-cost"]) == 0
    assert f"resuming from {out / 'checkpoint-2'}" in capsys.readouterr().out
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and json.loads((out / "model_card.json").read_text())["steps"] == 3
