"""Issue #65, "One API": every method is ``target.generate(..., custom_generate=hf_specdec.<method>)``, a method that
needs a drafter takes it as ``drafter=`` (else the target's shipped one, else one clear error), library errors name
the library's parameters, and the CLI's target flag is ``--model`` everywhere (``--target`` deprecated). Tiny
random-weight models."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM
from transformers.generation.utils import GenerateDecoderOnlyOutput

import hf_specdec
from hf_specdec import shipped
from hf_specdec.core.stats import DecodeStats
from hf_specdec.errors import SpecDecError
from hf_specdec.target import load_target

from .conftest import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    """A tiny target, a GLIDE and an EDD drafter for it (EDD initialised from the target, so it drafts well), and a
    tiny "SAR-SFT" model for SPACE."""
    target = tiny_llama(num_hidden_layers=4)
    glide = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    space = tiny_llama(seed=1)
    space.config.space_k, space.config.space_mask_token_id = 2, space.config.vocab_size - 1
    return {"target": target, "glide": glide, "edd": edd, "space": space}


def test_edd_pct_gives_plain_greedy_tokens(models):
    target, edd = models["target"], models["edd"]
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False)
    for seed in range(2):
        torch.manual_seed(seed)
        ids = torch.randint(3, 90, (1, 8))
        stats = DecodeStats()
        out = (
            target.generate(  # the paper's PCT (s_d / s_t timed): on tiny models the cost rule may not draft
                ids, custom_generate=hf_specdec.edd_pct, drafter=edd, pct_cost=False, stats=stats, **kw
            )
        )
        assert torch.equal(out, target.generate(ids, **kw))
        assert stats.drafted > 0 and stats.target_forwards < 16  # trees were drafted and accepted
    out = target.generate(ids, custom_generate=hf_specdec.edd_pct, drafter=edd, pct_width=3, **kw)
    assert torch.equal(out, target.generate(ids, **kw))  # the default: sized by its cost on this machine


METHODS = {
    "pld_plus": lambda m: ("target", dict(custom_generate=hf_specdec.pld_plus)),
    "glide_cape": lambda m: ("target", dict(custom_generate=hf_specdec.glide_cape, drafter=m["glide"])),
    "edd_pct": lambda m: ("target", dict(custom_generate=hf_specdec.edd_pct, drafter=m["edd"])),
    "space": lambda m: ("space", dict(custom_generate=hf_specdec.space)),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_returns_a_generate_output(method, models):
    name, kwargs = METHODS[method](models)
    model = models[name]
    ids = torch.tensor([[1, 5, 6, 7, 8, 5, 6, 7]])
    kw = dict(
        max_new_tokens=8, min_new_tokens=8, do_sample=False, return_dict_in_generate=True, output_scores=True
    )
    out = model.generate(ids, **kwargs, **kw)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, model.generate(ids, **kw).sequences) and len(out.scores) == 8


@pytest.mark.parametrize("method, kind", [("edd_pct", "edd"), ("glide_cape", "glide")])
def test_no_drafter_and_none_shipped_is_one_clear_error(method, kind, models):
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(SpecDecError) as err:
        models["target"].generate(ids, max_new_tokens=3, custom_generate=getattr(hf_specdec, method))
    message = str(err.value)
    assert "drafter=" in message and f"`hf-specdec train {kind} --model MODEL --output-dir DIR`" in message
    assert f"one ships for: {', '.join(shipped.shipped_targets(kind))}" in message


def test_no_drafter_takes_the_shipped_one_loaded_once(models, tmp_path, monkeypatch):
    """Given no drafter=, edd_pct loads the drafter shipped for the target once and keeps it on the target."""
    target, edd = tiny_llama(num_hidden_layers=4), models["edd"]
    edd.save_pretrained(tmp_path / "edd")
    looked = []
    monkeypatch.setattr(
        shipped, "shipped_checkpoint", lambda kind, model: looked.append(kind) or tmp_path / kind
    )
    ids = torch.tensor([[1, 5, 6, 7, 8, 5, 6, 7]])
    kw = dict(max_new_tokens=6, do_sample=False)
    for _ in range(2):
        out = target.generate(ids, custom_generate=hf_specdec.edd_pct, **kw)
        assert torch.equal(out, target.generate(ids, **kw))
    assert looked == ["edd"]  # loaded by the first call only
    assert shipped.shipped_drafter("edd", target) is shipped.shipped_drafter("edd", target)
    assert not any(isinstance(m, EddForCausalLM) for m in target.modules())  # kept on it, not a submodule


def test_edd_pct_refuses_another_drafter(models):
    with pytest.raises(SpecDecError, match=r"edd_pct needs an EDD drafter .*drafter=, got GlideForCausalLM"):
        models["target"].generate(
            torch.tensor([[3, 4, 5]]),
            max_new_tokens=3,
            custom_generate=hf_specdec.edd_pct,
            drafter=models["glide"],
        )


def test_library_errors_name_parameters_and_the_cli_its_flags(capsys):
    from hf_specdec.cli import main

    with pytest.raises(SpecDecError) as err:
        load_target(None, gguf_file="a.gguf")
    assert "gguf_file=" in str(err.value) and "model=" in str(err.value) and "--" not in str(err.value)
    assert main(["demo", "--gguf-file", "a.gguf"]) == 2
    cli = capsys.readouterr().err
    assert "--gguf-file" in cli and "--model" in cli and "gguf_file=" not in cli


def test_the_deprecated_target_flag_still_works_and_warns(tmp_path, capsys):
    from hf_specdec.cli import build_parser, main

    args = build_parser().parse_args(["train", "edd", "--target", "m", "--output-dir", str(tmp_path / "o")])
    assert args.model == "m"
    assert "--target is deprecated" in capsys.readouterr().err
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.gguf").write_bytes(b"GGUF")
    assert (
        main(["train", "glide", "--target", str(tmp_path / "only"), "--output-dir", str(tmp_path / "o")]) == 2
    )
    err = capsys.readouterr().err
    assert "--target is deprecated: use --model" in err and "holds GGUF files (a.gguf)" in err


@pytest.mark.real
def test_the_default_target_uses_its_shipped_drafters(real_target):
    """Given no drafter=, glide_cape and edd_pct on the default target run its shipped GLIDE / EDD drafter."""
    target, tokenizer = real_target
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    kw = dict(max_new_tokens=8, do_sample=False)
    plain = target.generate(ids, **kw)
    for method, kind in ((hf_specdec.glide_cape, "glide"), (hf_specdec.edd_pct, "edd")):
        assert torch.equal(target.generate(ids, custom_generate=method, **kw), plain)
        drafter = shipped.shipped_drafter(kind, target)  # the one the call loaded, kept on the target
        assert drafter.target is target and drafter.name_or_path.endswith(f"{kind}-smollm2")
