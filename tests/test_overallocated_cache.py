"""The tree loops verify into ``hf_compat.OverallocatedLayer`` caches when the caller passes none
(``sliding_window.verification_cache``): greedy output stays token-identical to plain ``generate``, the buffers are
written and compacted in place, the returned cache continues a later ``generate``, and a caller's cache that holds
entries keeps its own layers."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from hf_specdec.core import ragged_cache
from hf_specdec.core.kv_cache import compact_cache
from hf_specdec.core.sliding_window import verification_cache
from hf_specdec.core.tree_decoding import tree_generate
from hf_specdec.hf_compat import CHUNK_ENTRIES, OverallocatedLayer

from .conftest import left_pad, tiny_gpt2, tiny_llama
from .test_batching import RowOracle, alone, prompts_of
from .test_kv_cache import tiny_mistral
from .test_tree_decoding import NoisyOracle

pytestmark = pytest.mark.usefixtures("one_thread")


class PointerSpy(NoisyOracle):
    """A NoisyOracle that records, after every forward, each cache layer's type, entries and buffer address."""

    def __init__(self, reference: torch.Tensor, seed: int):
        super().__init__(reference, seed)
        self.seen = []

    def observe(self, feedback):
        super().observe(feedback)
        layers = feedback.past_key_values.layers
        self.seen.append([(type(layer), layer.get_seq_length(), layer.keys.data_ptr()) for layer in layers])


def _greedy(model, prompt, n, **kw):
    return model.generate(prompt, max_new_tokens=n, do_sample=False, **kw)


@pytest.mark.parametrize(
    "make,impl",
    [
        (tiny_llama, "sdpa"),
        (tiny_llama, "eager"),
        (tiny_gpt2, "sdpa"),
        (lambda: tiny_mistral(window=12), "sdpa"),
    ],
)
def test_tree_generate_into_an_in_place_cache_is_plain_greedy(make, impl):
    """Token-identical to plain greedy ``generate``; every layer an OverallocatedLayer whose buffer never moves
    while the sequence fits its first chunk; the cache holds every token but the last."""
    model = make()
    model.set_attn_implementation(impl)
    for seed in range(4):
        prompt = torch.randint(3, 97, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        ref = _greedy(model, prompt, 24)
        spy = PointerSpy(ref, seed)
        out = _greedy(
            model, prompt, 24, custom_generate=tree_generate, proposer=spy, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, ref), seed
        assert {kind for step in spy.seen for kind, _, _ in step} == {OverallocatedLayer}
        for layer in range(len(spy.seen[0])):  # one buffer per layer for the whole generation
            assert len({step[layer][2] for step in spy.seen}) == 1, (seed, layer)
        cache = out.past_key_values
        assert cache.get_seq_length() == ref.shape[1] - 1 < CHUNK_ENTRIES
        assert all(type(layer) is OverallocatedLayer for layer in cache.layers)


def test_the_returned_cache_continues_generate():
    """``past_key_values`` of a tree run continues plain ``generate`` and another tree run, as a DynamicCache."""
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 7), generator=torch.Generator().manual_seed(5))
    ref = _greedy(model, prompt, 30)
    first = _greedy(model, prompt, 12, custom_generate=tree_generate, proposer=NoisyOracle(ref, 0),
                    return_dict_in_generate=True)  # fmt: skip
    assert isinstance(first.past_key_values, DynamicCache) and torch.equal(first.sequences, ref[:, :19])
    plain = _greedy(model, first.sequences, 18, past_key_values=first.past_key_values)
    assert torch.equal(plain, ref)
    again = _greedy(model, prompt, 12, custom_generate=tree_generate, proposer=NoisyOracle(ref, 1),
                    return_dict_in_generate=True)  # fmt: skip
    tree = _greedy(model, again.sequences, 18, custom_generate=tree_generate, proposer=NoisyOracle(ref, 2),
                   past_key_values=again.past_key_values)  # fmt: skip
    assert torch.equal(tree, ref)


def test_a_long_generation_grows_by_chunks():
    """Past the first chunk the buffer moves once to the next multiple of CHUNK_ENTRIES, entries intact."""
    model = tiny_llama(max_position_embeddings=1024)
    prompt = torch.randint(3, 97, (1, CHUNK_ENTRIES - 20), generator=torch.Generator().manual_seed(1))
    ref = _greedy(model, prompt, 40)
    spy = PointerSpy(ref, 3)
    out = _greedy(
        model, prompt, 40, custom_generate=tree_generate, proposer=spy, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, ref)
    assert len({step[0][2] for step in spy.seen}) == 2  # the prefill's buffer, then the second chunk's
    assert out.past_key_values.layers[0].capacity == 2 * CHUNK_ENTRIES
    plain = _greedy(model, prompt, 40, return_dict_in_generate=True)
    for a, b in zip(out.past_key_values.layers, plain.past_key_values.layers):
        torch.testing.assert_close(a.keys, b.keys[:, :, : a.keys.shape[-2]], atol=1e-5, rtol=1e-4)


def test_compaction_keeps_exactly_the_accepted_entries_in_place():
    """``compact_cache`` on an OverallocatedLayer leaves what it leaves on a DynamicLayer, bit for bit, without
    moving the buffer; the next update lands right after the kept entries."""
    g = torch.Generator().manual_seed(0)
    prefix, fed = torch.randn(1, 2, 9, 4, generator=g), torch.randn(1, 2, 6, 4, generator=g)
    caches = [DynamicCache(), DynamicCache()]
    caches[1].layers = [OverallocatedLayer()]
    caches[0].layers = [DynamicLayer()]
    for cache in caches:
        cache.layers[0].update(prefix, -prefix)
        cache.layers[0].update(fed, -fed)
    pointer = caches[1].layers[0].keys.data_ptr()
    for cache in caches:
        compact_cache(cache, 9, [0, 2, 5])
    dynamic, spare = caches[0].layers[0], caches[1].layers[0]
    assert torch.equal(spare.keys, dynamic.keys) and torch.equal(spare.values, dynamic.values)
    assert torch.equal(spare.keys, torch.cat([prefix, fed[:, :, [0, 2, 5]]], dim=-2))
    assert spare.keys.data_ptr() == pointer and spare.get_seq_length() == 12
    nxt = torch.randn(1, 2, 1, 4, generator=g)
    keys, _ = spare.update(nxt, -nxt)
    assert keys.data_ptr() == pointer and torch.equal(keys, torch.cat([dynamic.keys, nxt], dim=-2))


def test_a_batch_verifies_into_an_in_place_cache(monkeypatch):
    """The ragged batch cache takes OverallocatedLayers too; every row stays what it is alone."""
    seen = []
    original = ragged_cache.RaggedCache.__init__

    def spy(self, cache, masks=None):
        seen.append(cache)
        original(self, cache, masks)

    monkeypatch.setattr(ragged_cache.RaggedCache, "__init__", spy)
    model = tiny_llama()
    prompts = prompts_of((5, 11, 3, 8), 2)
    refs = [alone(model, p, 20) for p in prompts]
    ids, mask = left_pad(prompts)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0,
                         custom_generate=tree_generate, proposer=RowOracle(refs, 2))  # fmt: skip
    for i, p in enumerate(prompts):
        assert out[i, ids.shape[1] - len(p) :].tolist() == refs[i], i
    (cache,) = seen
    assert len(cache.layers) == 2 and all(type(layer) is OverallocatedLayer for layer in cache.layers)


def test_a_callers_cache_with_entries_keeps_its_layers():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(2))
    ref = _greedy(model, prompt, 16)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt[:, :-2], past_key_values=cache, use_cache=True)
    assert verification_cache(model, cache) is cache
    out = _greedy(model, prompt, 16, custom_generate=tree_generate, proposer=NoisyOracle(ref, 0),
                  past_key_values=cache)  # fmt: skip
    assert torch.equal(out, ref)
    assert all(type(layer) is DynamicLayer for layer in cache.layers) and cache.get_seq_length() == 23
