"""Shared fixtures: tiny random-weight models for logic, the real default target for end-to-end truth."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_llama(vocab_size: int = 97, seed: int = 0, **overrides):
    """A 2-layer Llama with GQA (4 query heads over 2 KV heads) and random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def tiny_gpt2(vocab_size: int = 97, seed: int = 0):
    """A second architecture (learned absolute positions, fused QKV, no GQA) with random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=512, bos_token_id=1, eos_token_id=2
    )
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def real_target():
    """(model, tokenizer) of the embedded default target in fp32; converted once per machine."""
    from hf_specdec import load_default_target

    return load_default_target("fp32")
