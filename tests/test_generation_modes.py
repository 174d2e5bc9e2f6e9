"""Issue 31: every entry point refuses the generation modes no method implements (beams of any kind, contrastive
search, DoLa, classifier-free guidance, several sequences per prompt) with an error naming the option, instead of
returning beams or ignoring a drafter (``core/generate_io.check_generation_mode``). Tiny random-weight models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM

import hf_specdec
from hf_specdec.core.ngram_tree import NGramTreeProposer
from hf_specdec.custom_generate_export import export_custom_generate
from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

# (the option the error must name, the generate keywords that turn the mode on)
MODES = [
    ("num_beams", dict(num_beams=2)),
    ("num_beam_groups", dict(num_beam_groups=2)),
    ("diversity_penalty", dict(diversity_penalty=1.0)),
    ("force_words_ids", dict(force_words_ids=[[5]])),
    ("penalty_alpha", dict(penalty_alpha=0.6, top_k=4)),
    ("dola_layers", dict(dola_layers="low")),
    ("num_return_sequences", dict(num_return_sequences=2, do_sample=True)),
    ("guidance_scale", dict(guidance_scale=1.5)),
]
# transformers itself refuses these before any assistant is asked: contrastive and constrained beam search moved to
# Hub repos that need trust_remote_code=True
TRANSFORMERS_FIRST = {"penalty_alpha", "force_words_ids"}
PROMPT = [[1, 5, 6, 7, 8, 5, 6, 7]]
RUNNER = r"""
import json, sys
sys.modules["hf_specdec"] = None  # the exported folder must work without hf_specdec
import torch
from transformers import AutoModelForCausalLM
spec = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
results = []
for kwargs in spec["modes"]:
    try:
        out = model.generate(torch.tensor(spec["prompt"]), custom_generate=spec["dir"], trust_remote_code=True,
                             max_new_tokens=3, **kwargs)
        results.append(["returned", list(out.shape)])
    except Exception as err:
        results.append([type(err).__name__, str(err)])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def models():
    """A tiny target, a GLIDE and an EDD drafter for it, and a tiny "SAR-SFT" model (a mask token id and k)."""
    from hf_specdec.modeling import EddConfig, EddForCausalLM

    target = tiny_llama(num_hidden_layers=4)
    glide = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    space = tiny_llama(seed=1)
    space.config.space_k, space.config.space_mask_token_id = 2, space.config.vocab_size - 1
    return {"target": target, "glide": glide, "edd": edd, "space": space}


def _exported(method, tmp_path, model, modes) -> list:
    """``modes`` through ``custom_generate=<exported folder>`` in a separate Python without hf_specdec: per mode
    ``[error class name, message]`` or ``["returned", shape]``."""
    folder = export_custom_generate(method, tmp_path / method)
    model.save_pretrained(tmp_path / "model")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "OMP_NUM_THREADS": "1",
    }
    spec = json.dumps(
        {"model": str(tmp_path / "model"), "dir": str(folder), "prompt": PROMPT, "modes": modes}
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", RUNNER, spec], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _call(entry: str, models: dict):
    """``generate(**mode)`` through ``entry`` (one model call per mode)."""
    target, glide, edd = models["target"], models["glide"], models["edd"]
    ids = torch.tensor(PROMPT)
    batch = torch.tensor([[0, 0, 5, 6, 7, 5, 6, 7], PROMPT[0]])
    calls = {
        "pld_plus": lambda **m: target.generate(ids, custom_generate=hf_specdec.pld_plus, **m),
        "glide_cape": lambda **m: target.generate(
            ids, custom_generate=hf_specdec.glide_cape, drafter=glide, **m
        ),
        "space": lambda **m: models["space"].generate(ids, custom_generate=hf_specdec.space, **m),
        "tree_generate": lambda **m: target.generate(
            ids, custom_generate=hf_specdec.tree_generate, proposer=NGramTreeProposer(), **m
        ),
        "edd_pct": lambda **m: target.generate(ids, custom_generate=hf_specdec.edd_pct, drafter=edd, **m),
        "assistant_glide": lambda **m: target.generate(ids, assistant_model=glide, **m),
        "assistant_edd": lambda **m: target.generate(ids, assistant_model=edd, **m),
        "assistant_glide_batch": lambda **m: target.generate(
            batch, attention_mask=(batch != 0).long(), pad_token_id=0, assistant_model=glide, **m
        ),
    }
    return calls[entry]


@pytest.mark.parametrize(
    "entry",
    [
        "pld_plus",
        "glide_cape",
        "space",
        "tree_generate",
        "edd_pct",
        "assistant_glide",
        "assistant_edd",
        "assistant_glide_batch",
        "export_pld_plus",
        "export_tree_lookup",
    ],
)
def test_every_entry_point_refuses_modes_it_does_not_implement(entry, models, tmp_path):
    if entry.startswith("export_"):
        got = _exported(entry.removeprefix("export_"), tmp_path, models["target"], [m for _, m in MODES])
    else:
        call, got = _call(entry, models), []
        for _, mode in MODES:
            try:
                got.append(["returned", list(call(max_new_tokens=3, **mode).shape)])
            except ValueError as err:  # SpecDecError is a ValueError
                got.append([type(err).__name__, str(err)])
    for (option, mode), (kind, message) in zip(MODES, got):
        if entry.startswith("assistant") and option in TRANSFORMERS_FIRST:
            assert kind in ("ValueError", "SpecDecError") and "trust_remote_code" in str(message), (
                option,
                message,
            )
            continue
        assert kind == "SpecDecError", f"{entry} with {mode}: {kind} {message}"
        assert "does not implement" in message and f"drop {option};" in message, message


def test_greedy_and_sampling_still_run(models):
    """The check lets through what the loops implement: greedy, sampling, one sequence, the default config."""
    from transformers import GenerationConfig

    from hf_specdec.core.generate_io import check_generation_mode

    for config in (
        GenerationConfig(),
        GenerationConfig(do_sample=True, top_k=5),
        models["target"].generation_config,
    ):
        check_generation_mode(config, "test")
    check_generation_mode(GenerationConfig(num_beams=1, num_return_sequences=1, guidance_scale=1.0), "test")
    out = models["target"].generate(
        torch.tensor(PROMPT), custom_generate=hf_specdec.pld_plus, max_new_tokens=3, do_sample=False
    )
    assert out.shape == (1, len(PROMPT[0]) + 3)
    with pytest.raises(
        SpecDecError, match=r"^test does not implement beam search \(num_beams=3\): drop num_beams;"
    ):
        check_generation_mode(GenerationConfig(num_beams=3), "test")
