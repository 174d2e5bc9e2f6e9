"""KV-cache compaction to an accepted tree path equals the cache of a plain forward over the accepted tokens."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, MistralConfig, MistralForCausalLM, StaticCache

from hf_specdec.core.kv_cache import check_cache_supported, check_tree_support, compact_cache
from hf_specdec.core.tree import TokenTree, additive_mask
from hf_specdec.errors import SpecDecError

from .conftest import tiny_gpt2, tiny_llama
from .test_tree_mask import random_tree

pytestmark = pytest.mark.usefixtures("one_thread")


def _tree_forward(model, prompt, tree):
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt[:, :-1], past_key_values=cache, use_cache=True)
    P = prompt.shape[1] - 1
    model(
        input_ids=tree.flat_tokens(int(prompt[0, -1])),
        position_ids=tree.position_ids(P),
        attention_mask=additive_mask(tree.attention_mask(P), model.dtype),
        past_key_values=cache,
        use_cache=True,
    )
    return cache, P


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2])
def test_compacted_cache_equals_plain_cache(make):
    model = make()
    rng = random.Random(1)
    for trial in range(3):
        prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(trial))
        tree = random_tree(rng, 8)
        node = rng.randint(-1, len(tree) - 1)  # accept the path to a random node (root only when -1)
        path = tree.path(node) if node >= 0 else []
        cache, P = _tree_forward(model, prompt, tree)
        compact_cache(cache, P, [0] + [c + 1 for c in path])
        ref = DynamicCache(config=model.config)
        model(
            input_ids=torch.cat([prompt, tree.tokens[path][None]], dim=1), past_key_values=ref, use_cache=True
        )
        assert cache.get_seq_length() == ref.get_seq_length() == P + 1 + len(path)
        for got, want in zip(cache.layers, ref.layers):
            torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-4)


def test_contiguous_keep_is_a_crop():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 5))
    cache, P = _tree_forward(model, prompt, TokenTree.from_chain([7, 8, 9]))
    before = cache.layers[0].keys.clone()
    compact_cache(cache, P, [0, 1])
    assert torch.equal(cache.layers[0].keys, before[..., : P + 2, :])


def test_bad_offsets_raise():
    model = tiny_llama()
    cache, P = _tree_forward(model, torch.randint(3, 97, (1, 5)), TokenTree.from_chain([7, 8]))
    with pytest.raises(SpecDecError, match="increasing"):
        compact_cache(cache, P, [0, 2, 1])
    with pytest.raises(SpecDecError, match="past the cache end"):
        compact_cache(cache, P, [0, 5])


def test_static_cache_is_rejected():
    model = tiny_llama()
    with pytest.raises(SpecDecError, match="cannot be compacted"):
        check_cache_supported(StaticCache(config=model.config, max_cache_len=32))


def tiny_mistral(window: int = 8) -> MistralForCausalLM:
    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=window,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return MistralForCausalLM(cfg).eval()


def test_sliding_window_support_is_bounded_by_the_window():
    model = tiny_mistral(window=8)
    cache = DynamicCache(config=model.config)
    assert type(cache.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    model(input_ids=torch.randint(3, 97, (1, 4)), past_key_values=cache, use_cache=True)
    assert check_tree_support(cache, 3)  # 4 + 3 <= window - 1
    assert not check_tree_support(cache, 4)
