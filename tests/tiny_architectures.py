"""Tiny random-weight targets of six decoder architectures: the factories the architecture tests
(``test_architectures*.py``) run every method on. Hidden size 64, GQA (4 query heads over 2 KV heads) where the
architecture has it, a small vocabulary; each keeps what makes its architecture different from Llama."""

from __future__ import annotations

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "mistral", "phi3")
WINDOW = 16  # Gemma 3's and Mistral's sliding window: prompt + generation cross it

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)


def _config(name: str, vocab_size: int, **overrides):
    import transformers as tf

    common = dict(_COMMON, vocab_size=vocab_size, num_hidden_layers=2)
    if name == "llama":
        return tf.LlamaConfig(**{**common, **overrides})
    if name == "qwen2":  # attention biases on q, k, v
        return tf.Qwen2Config(**{**common, **overrides})
    if name == "qwen3":  # q/k norms, explicit head_dim
        return tf.Qwen3Config(**{**common, "head_dim": 16, **overrides})
    if name == "gemma3":  # (1 + w) sandwich norms, q/k norms, scaled embeddings, sliding and full layers
        layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
        values = dict(common, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=16)
        values.update(layer_types=layer_types, sliding_window=WINDOW, tie_word_embeddings=True)
        return tf.Gemma3TextConfig(**{**values, **overrides})
    if name == "mistral":  # every layer sliding-window
        return tf.MistralConfig(**{**common, "head_dim": 16, "sliding_window": WINDOW, **overrides})
    if name == "phi3":  # fused qkv_proj / gate_up_proj, partial rotary embedding
        return tf.Phi3Config(**{**common, "partial_rotary_factor": 0.5, **overrides})
    raise ValueError(f"unknown architecture {name!r}")


def tiny_target(name: str, vocab_size: int = 64, seed: int = 0, **overrides):
    """A tiny ``name`` causal LM with random weights; biases and norm weights are drawn too (they start at 0 / 1),
    so that a drafter copying them wrongly, or a norm convention mixed up, changes the numbers."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        _config(name, vocab_size, **overrides), attn_implementation="sdpa"
    )
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    return model.eval()
