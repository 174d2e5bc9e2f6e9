"""Drafter training on an existing distributed engine: ``torchrun --nproc_per_node 2`` (gloo, this CPU) trains the
same drafter as one process with the same global batch, and evaluates to the same metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _train(out, corpus, *launcher_and_batch: str) -> dict:
    *launcher, batch, accum = launcher_and_batch
    cmd = [
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
            "--max-steps 2 --block-size 64 --eval-blocks 4 --eval-batch-size 2 --eval-steps 100 --save-steps 100".split()
        ),
        *("--measure-prompts 0 --block-min 5 --block-max 5 --warmup-steps 0 --lr 1e-3".split()),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    from safetensors.torch import load_file

    card = json.loads((out / "model_card.json").read_text())
    return {"weights": load_file(str(out / "model.safetensors")), "card": card}


@pytest.mark.real
@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process_with_the_same_global_batch(real_target, tmp_path):
    import torch
    from hf_specdec.trainers.corpus import build_corpus

    corpus = tmp_path / "corpus"
    build_corpus(real_target[1], corpus, limit_conversations=12)
    python = [sys.executable]
    one = _train(tmp_path / "one", corpus, *python, "4", "1")
    accumulated = _train(tmp_path / "accum", corpus, *python, "2", "2")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    two = _train(tmp_path / "two", corpus, *torchrun, "2", "1")

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
    assert "x2 processes" in two["card"]["budget"]
    # the steps really trained: the layer moved away from its start (a copy of the target's layer 0)
    start = real_target[0].model.layers[0].self_attn.q_proj.weight
    trained = one["weights"]["decoder.layers.0.self_attn.q_proj.weight"]
    assert (trained - start).abs().max() > 1e-4
    # one process wrote: exactly one drafter, no per-rank copies
    assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.suffix == ".safetensors") == [
        "model.safetensors"
    ]
