"""Bad input as a new user gives it (#18): an empty prompt to every entry point, and a truncated checkpoint to
drafter / target loading and the CLI, each end in one clear SpecDecError naming the input and what to do."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM
from transformers import AutoModelForCausalLM

import hf_specdec
from hf_specdec.bench.tree_methods import NGramTreeProposer
from hf_specdec.cli import main
from hf_specdec.errors import SpecDecError
from hf_specdec.target import load_target

from .conftest import tiny_llama

EMPTY = torch.zeros(1, 0, dtype=torch.long)


def _glide(target):
    return GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()


def _edd(target):
    return EddForCausalLM(EddConfig.for_target(target)).attach_target(target).eval()


ENTRY_POINTS = {
    "pld_plus": lambda t: dict(custom_generate=hf_specdec.pld_plus),
    "pld_plus_attention": lambda t: dict(custom_generate=hf_specdec.pld_plus, pld_variant="attention"),
    "glide_cape": lambda t: dict(custom_generate=hf_specdec.glide_cape, drafter=_glide(t)),
    "edd_pct": lambda t: dict(custom_generate=hf_specdec.edd_pct, drafter=_edd(t)),
    "tree_generate": lambda t: dict(custom_generate=hf_specdec.tree_generate, proposer=NGramTreeProposer()),
    "space": lambda t: dict(custom_generate=hf_specdec.space),
    "assistant_glide": lambda t: dict(assistant_model=_glide(t)),
    "assistant_edd": lambda t: dict(assistant_model=_edd(t)),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_empty_prompt_is_a_clear_error(entry):
    target = tiny_llama()
    target.config.space_mask_token_id = 96
    with pytest.raises(SpecDecError, match=r"empty prompt .*pass at least one token"):
        target.generate(EMPTY, max_new_tokens=4, do_sample=False, **ENTRY_POINTS[entry](target))


def _truncate(folder):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("kind", ["glide", "edd"])
def test_truncated_drafter_checkpoint_names_the_file(kind, tmp_path):
    target = tiny_llama()
    drafter, cls = (_glide(target), GlideForCausalLM) if kind == "glide" else (_edd(target), EddForCausalLM)
    drafter.save_pretrained(tmp_path)
    path = _truncate(tmp_path)
    message = rf"{path}.* truncated or corrupt .*re-download the drafter or re-train it"
    with pytest.raises(SpecDecError, match=message):
        cls.from_pretrained(tmp_path, target=target)
    with pytest.raises(SpecDecError, match=message):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_truncated_target_checkpoint_names_the_file_and_the_cli_exits_2(tmp_path, capsys):
    tiny_llama().save_pretrained(tmp_path)
    path = _truncate(tmp_path)
    with pytest.raises(
        SpecDecError, match=rf"model={tmp_path}: {path} is truncated or corrupt .*re-download"
    ):
        load_target(tmp_path)
    capsys.readouterr()
    assert main(["demo", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"hf-specdec: error: --model {tmp_path}: ")
        and str(path) in err
        and "Traceback" not in err
    )
    assert len(err.strip().splitlines()) == 1
