"""Training on an existing distributed engine: ``torchrun --nproc_per_node 2`` (gloo, this CPU) trains the same
drafter (and the same SAR-SFT LoRA) as one process with the same global batch, and evaluates to the same metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest


def _launch(*cmds: list[str]) -> None:
    """Run the commands side by side (one thread each: this machine's two cores) and wait for all of them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [tempfile.TemporaryFile("w+") for _ in cmds]  # not pipes: a full pipe would stall its process
    running = [subprocess.Popen(c, env=env, stdout=log, stderr=log) for c, log in zip(cmds, logs)]
    for process, log in zip(running, logs):
        process.wait(timeout=900)
        log.seek(0)
        assert process.returncode == 0, log.read()[-3000:]


def _train_command(out, corpus, *launcher_and_batch: str) -> list[str]:
    *launcher, batch, accum = launcher_and_batch
    return [
        *launcher,
        "-m",
        "hf_specdec.cli",
        "train",
        "edd",
        "--output-dir",
        str(out),
        "--corpus",
        str(corpus),
        "--batch-size",
        batch,
        "--grad-accum",
        accum,
        *(
            "--max-steps 2 --block-size 64 --eval-blocks 4 --eval-length 64 --eval-batch-size 2 --eval-steps 100 "
            "--save-steps 100".split()
        ),
        *(
            "--measure-prompts 0 --no-card-cost --block-min 5 --block-max 5 --warmup-steps 0 --lr 1e-3 "
            "--precision fp32".split()  # equal to the tolerance in fp32; bf16 rounds by the batch's shape
        ),
    ]


def _trained(out) -> dict:
    from safetensors.torch import load_file

    card = json.loads((out / "model_card.json").read_text())
    return {"weights": load_file(str(out / "model.safetensors")), "card": card}


@pytest.mark.real
@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process_with_the_same_global_batch(real_target, tmp_path):
    import torch
    from hf_specdec.trainers.data.tokenized import build_corpus

    corpus = tmp_path / "corpus"
    build_corpus(real_target[1], corpus, limit_conversations=12)
    python = [sys.executable]
    _launch(
        _train_command(tmp_path / "one", corpus, *python, "4", "1"),
        _train_command(tmp_path / "accum", corpus, *python, "2", "2"),
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    evaluate = [*_train_command(tmp_path / "evaluated", corpus, *python, "4", "1"), "--eval-only"]
    _launch(
        _train_command(tmp_path / "two", corpus, *torchrun, "2", "1"),
        [*evaluate, "--init-from", str(tmp_path / "one")],
    )
    one, accumulated, two = (_trained(tmp_path / name) for name in ("one", "accum", "two"))

    for other in (accumulated, two):
        assert other["weights"].keys() == one["weights"].keys()
        for name, w in one["weights"].items():
            torch.testing.assert_close(other["weights"][name], w, atol=2e-5, rtol=1e-4)
        metrics = {k: v for k, v in other["card"]["validation"].items() if k != "epoch"}
        expected = {k: v for k, v in one["card"]["validation"].items() if k != "epoch"}
        assert metrics.keys() == expected.keys()
        for k, v in expected.items():
            assert metrics[k] == pytest.approx(v, abs=2e-4), k
    assert one["card"]["train_tokens"] == two["card"]["train_tokens"] == 2 * 4 * 64
    # --eval-only on the saved drafter: the run's own final validation, from the saved files, and nothing trained
    evaluated = json.loads((tmp_path / "evaluated" / "eval_results.json").read_text())
    assert evaluated["drafter"] == str(tmp_path / "one")
    for k, v in one["card"]["validation"].items():
        if k != "epoch":
            assert evaluated[f"eval_{k}"] == pytest.approx(v, abs=2e-4), k
    assert evaluated["validation_rows"] == one["card"]["validation_rows"]
    assert not (tmp_path / "evaluated" / "model.safetensors").exists()
    assert "x2 processes" in two["card"]["budget"]
    # the card's command is the one that ran, however it was started (here `python -m hf_specdec.cli`)
    assert one["card"]["command"].startswith(f"hf-specdec train edd --output-dir {tmp_path / 'one'} ")
    # the training speed and the machine it was measured on (tokens per hour, before and after bf16)
    assert one["card"]["train_tokens_per_hour"] > 0 and " threads, " in one["card"]["machine"]
    # --no-card-cost: c is not timed (test_calibration checks a card that has it)
    assert "cost" not in one["card"]
    # the steps really trained: the layer moved away from its start (a copy of the target's layer 0)
    start = real_target[0].model.layers[0].self_attn.q_proj.weight
    trained = one["weights"]["decoder.layers.0.self_attn.q_proj.weight"]
    assert (trained - start).abs().max() > 1e-4
    # one process wrote: exactly one drafter, no per-rank copies
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.suffix == ".safetensors") == [
        "model.safetensors"
    ]


def _train_space(out, *launcher_and_batch: str) -> dict:
    *launcher, batch = launcher_and_batch
    options = (
        "--max-steps 2 --max-length 48 --eval-samples 4 --eval-steps 100 --save-steps 100 --logging-steps 1"
    )
    options += " --tau-prompts 0 --save adapter --lr 1e-3 --k 3 --p-ar 0.5 --lora-r 4 --lora-dropout 0 --precision fp32"
    _launch(
        [
            *launcher,
            "-m",
            "hf_specdec.cli",
            "train",
            "space",
            "--output-dir",
            str(out),
            "--batch-size",
            batch,
            *options.split(),
        ]
    )
    from safetensors.torch import load_file

    return {
        "weights": load_file(str(out / "final" / "adapter_model.safetensors")),
        "card": json.loads((out / "final" / "space_training.json").read_text()),
    }


@pytest.mark.real
@pytest.mark.slow
def test_torchrun_trains_space_as_one_process_with_the_same_global_batch(real_target, tmp_path):
    """`hf-specdec train space` in two processes: the SAR masks are drawn per sample, so both processes' batches
    together are the one-process batch, and the LoRA + [M]-row weights after 2 steps are the same."""
    import torch

    one = _train_space(tmp_path / "one", sys.executable, "4")
    two = _train_space(
        tmp_path / "two", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "2"
    )
    assert two["weights"].keys() == one["weights"].keys()
    for name, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], w, atol=2e-5, rtol=1e-4)
    lora_b = [w for name, w in one["weights"].items() if "lora_B" in name]
    assert lora_b and max(w.abs().max() for w in lora_b) > 1e-4  # the steps trained (LoRA B starts at zero)
    assert one["card"]["batch"] == two["card"]["batch"] == 4 and two["card"]["processes"] == 2
    assert (
        " samples (<= 48 tokens) per hour, " in one["card"]["training"]
        and " threads, " in one["card"]["training"]
    )
    assert two["card"]["eval_loss"] == pytest.approx(one["card"]["eval_loss"], abs=2e-3)
    # one process wrote: one final model, one checkpoint, no per-rank copies
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.is_dir()) == ["checkpoint-2", "final"]


def test_the_shipped_gpu_configs_parse():
    """configs/ (README, "Training on several devices"): the DeepSpeed ZeRO-2 JSON and the accelerate FSDP config load
    (they are not run here: no GPU)."""
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    root = Path(__file__).resolve().parents[1] / "configs"
    ds = json.loads((root / "deepspeed_zero2.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2 and "optimizer" not in ds  # the Trainer's AdamW + schedule
    fsdp = load_config_from_file(str(root / "accelerate_fsdp.yaml"))
    assert fsdp.distributed_type == DistributedType.FSDP
    assert fsdp.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
