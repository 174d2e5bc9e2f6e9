"""hf_specdec/hf_compat.py: one test per entry (named ``test_<entry>``), each failing with the entry's name when
the installed transformers changes what the entry relies on; plus the guard that no transformers private name is
used outside hf_compat.py, and the assisted hook's pass-through and no-silent-fallback behaviour."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerationMixin

from hf_specdec import hf_compat
from hf_specdec.core import assisted
from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
# transformers' private names hf_specdec has used; only hf_compat.py may name them
PRIVATE = re.compile(
    r"\._(get_candidate_generator|assisted_decoding|attn_implementation|global_mapping|eos_token_tensor"
    r"|supports_logits_to_keep|prepare_inputs|validate_generation_mode)\b|models\.llama\.modeling_llama"
)


def _entry(name: str) -> str:
    return f"hf_compat entry {name!r} no longer matches the installed transformers"


def _glide(target) -> GlideForCausalLM:
    torch.manual_seed(0)
    return GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()


def test_every_entry_has_a_test():
    missing = [e for e in hf_compat.ENTRIES if f"test_{e}" not in globals()]
    assert not missing, f"hf_compat entries without a test: {missing}"


def test_no_transformers_private_name_outside_hf_compat():
    hits = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for folder in ("hf_specdec", "modeling", "trainers")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "hf_compat" not in path.parts
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert not hits, "transformers private names outside hf_specdec/hf_compat.py:\n" + "\n".join(hits)


# ------------------------------------------------------------------ the entries
def test_assisted_decoding(monkeypatch):
    """``_assisted_decoding`` takes the parameters the batch wrapper reads (and ``**model_kwargs``), generate
    (assistant_model=...) still runs it (once) on a batch, whose rows then come from the batched tree loop."""
    params = inspect.signature(hf_compat.ORIGINAL_ASSISTED_DECODING).parameters
    missing = [p for p in hf_compat.ASSISTED_DECODING_PARAMETERS if p not in params]
    assert not missing, f"{_entry('assisted_decoding')}: parameters {missing} are gone ({list(params)})"
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), (
        f"{_entry('assisted_decoding')}: no **model_kwargs ({list(params)})"
    )
    assert assisted.installed(), _entry("assisted_decoding") + ": the batch wrapper is not installed"
    calls = []

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("assistant_model"))
        return assisted._assisted_decoding(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", spy)
    target = tiny_llama()
    glide = _glide(target)
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 5, 6, 7, 8]])
    mask = (ids != 0).long()
    with assisted.batch_stats() as stats:
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, assistant_model=glide
        )
    assert calls == [glide], f"{_entry('assisted_decoding')}: generate ran it {len(calls)} times"
    assert stats.batched_forwards > 0, f"{_entry('assisted_decoding')}: the batch did not run the tree loop"
    for i, start in enumerate((2, 0)):
        alone = target.generate(ids[i : i + 1, start:], max_new_tokens=4, do_sample=False)[0]
        assert out[i, start : start + len(alone)].tolist() == alone.tolist()


def test_generation_mode_hook(monkeypatch):
    """``_validate_generation_mode`` takes the parameters the wrapper reads, generate still runs it (once) with the
    call's config and the assistant, and the wrapper passes every other call through (a plain beam search runs)."""
    params = list(inspect.signature(hf_compat.ORIGINAL_VALIDATE_GENERATION_MODE).parameters)
    missing = [p for p in hf_compat.VALIDATE_GENERATION_MODE_PARAMETERS if p not in params]
    assert not missing, f"{_entry('generation_mode_hook')}: parameters {missing} are gone ({params})"
    assert assisted.installed(), _entry("generation_mode_hook") + ": the hook is not installed"
    calls = []

    def spy(self, *args, **kwargs):
        arguments = hf_compat.generation_mode_arguments(self, args, kwargs)
        calls.append((arguments["generation_config"].num_beams, arguments["generation_mode_kwargs"]))
        return assisted._validate_generation_mode(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "_validate_generation_mode", spy)
    target, ids = tiny_llama(), torch.tensor([[1, 5, 6, 7]])
    glide = _glide(target)
    with pytest.raises(SpecDecError, match="assistant_model=GlideForCausalLM does not implement beam search"):
        target.generate(ids, max_new_tokens=2, num_beams=2, assistant_model=glide)
    assert len(calls) == 1, f"{_entry('generation_mode_hook')}: generate ran it {len(calls)} times"
    assert calls[0][0] == 2 and calls[0][1].get("assistant_model") is glide, _entry("generation_mode_hook")
    assert target.generate(ids, max_new_tokens=2, num_beams=2, do_sample=False).shape == (1, 6)


def test_attn_implementation():
    model = tiny_llama()
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        assert hf_compat.attn_implementation(model) == impl, _entry("attn_implementation")
        assert hf_compat.attn_implementation(model.config) == impl, _entry("attn_implementation")


@pytest.mark.parametrize("layer", [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=16)])
def test_cache_layers(layer):
    """Rewriting a layer's entries leaves a layer that reports and extends the new length."""
    assert hf_compat.CACHE_LAYER_TYPES == (
        DynamicLayer,
        hf_compat.OverallocatedLayer,
        DynamicSlidingWindowLayer,
    )
    k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    layer.update(k, v)
    for field in ("keys", "values", "is_initialized") + (
        ("cumulative_length",) if "Sliding" in type(layer).__name__ else ()
    ):
        assert hasattr(layer, field), f"{_entry('cache_layers')}: {type(layer).__name__}.{field} is gone"
    hf_compat.set_layer_entries(layer, layer.keys[..., :3, :], layer.values[..., :3, :])
    assert layer.get_seq_length() == 3, f"{_entry('cache_layers')}: the rewritten length is not reported"
    keys, _ = layer.update(k[..., :1, :], v[..., :1, :])
    assert keys.shape[-2] == 4 and layer.get_seq_length() == 4, _entry("cache_layers")
    torch.testing.assert_close(keys[..., :3, :], k[..., :3, :])
    with pytest.raises(SpecDecError, match="cannot rewrite"):
        hf_compat.set_layer_entries(object(), k, v)


def test_cache_layers_overallocated_layer_reads_as_a_dynamic_layer():
    """Through updates past its capacity and every way its entries get replaced, an OverallocatedLayer holds what a
    DynamicLayer holds; within capacity an update writes in place (the point of it)."""
    g = torch.Generator().manual_seed(0)
    dynamic, spare = DynamicLayer(), hf_compat.OverallocatedLayer()

    def both(op):
        for layer in (dynamic, spare):
            op(layer)
        assert spare.get_seq_length() == dynamic.get_seq_length(), _entry("cache_layers")
        torch.testing.assert_close(spare.keys, dynamic.keys, rtol=0, atol=0)
        torch.testing.assert_close(spare.values, dynamic.values, rtol=0, atol=0)

    def update(n):
        rows = dynamic.keys.shape[0] if dynamic.is_initialized else 3
        k, v = torch.randn(rows, 2, n, 4, generator=g), torch.randn(rows, 2, n, 4, generator=g)
        both(lambda layer: layer.update(k, v))

    update(5)
    before = spare.keys.data_ptr()
    for _ in range(hf_compat.CHUNK_ENTRIES + 3):  # past the first buffer's capacity
        update(1)
    assert spare.capacity == 2 * hf_compat.CHUNK_ENTRIES, "it never reallocated"
    during = spare.keys.data_ptr()
    update(1)
    assert spare.keys.data_ptr() == during != before, "an update within capacity should write in place"
    both(lambda layer: hf_compat.set_layer_entries(layer, layer.keys[:, :, :20], layer.values[:, :, :20]))
    update(2)  # written over the dropped entries of the prefix view
    both(lambda layer: layer.crop(-4))
    update(3)
    rows = torch.tensor([2, 0])
    both(lambda layer: hf_compat.set_layer_entries(layer, layer.keys[rows], layer.values[rows]))
    update(1)
    both(lambda layer: layer.batch_select_indices(torch.tensor([1])))
    update(2)


def test_cache_layers_overallocated_cache_gives_the_models_own_logits():
    """A model decoding into ``overallocated_cache()`` computes bit for bit what it computes into a DynamicCache."""
    from transformers import DynamicCache

    model = tiny_llama()
    ids = torch.randint(3, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    logits = []
    for cache in (DynamicCache(), hf_compat.overallocated_cache()):
        out, fed = [], ids
        with torch.no_grad():
            for _ in range(hf_compat.CHUNK_ENTRIES + 10):
                step = model(input_ids=fed, past_key_values=cache, use_cache=True).logits[:, -1]
                fed = step.argmax(-1, keepdim=True)
                out.append(step)
        logits.append(torch.stack(out))
        assert cache.get_seq_length() == 7 + hf_compat.CHUNK_ENTRIES + 9
    assert all(type(layer) is hf_compat.OverallocatedLayer for layer in cache.layers), _entry("cache_layers")
    assert torch.equal(logits[0], logits[1])


def test_cache_layers_what_the_overallocated_layer_relies_on():
    """The ``DynamicLayer`` / ``Cache`` API an OverallocatedLayer and ``overallocate_layers`` build on: the two-tensor
    ``lazy_initialization``, ``update`` returning every entry, ``crop`` leaving a view of the first entries, a cache's
    ``layers`` list and ``layer_class_to_replicate``, and the plain ``DynamicLayer`` layers that ``DynamicCache(config=)``
    builds for a full-attention model (what ``generate`` prepares)."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    params = list(inspect.signature(DynamicLayer.lazy_initialization).parameters)
    assert params[:3] == ["self", "key_states", "value_states"], f"{_entry('cache_layers')}: {params}"
    layer, k = DynamicLayer(), torch.randn(1, 2, 5, 4)
    keys, values = layer.update(k, k + 1)
    assert keys is layer.keys and values is layer.values and keys.shape[-2] == 5, _entry("cache_layers")
    layer.crop(-2)
    assert layer.keys.data_ptr() == keys.data_ptr() and layer.keys.stride() == keys.stride(), _entry(
        "cache_layers"
    )
    assert layer.get_seq_length() == 3, _entry("cache_layers")
    lazy = DynamicCache()
    assert lazy.layers == [] and lazy.layer_class_to_replicate is DynamicLayer, _entry("cache_layers")
    assert "layer_class_to_replicate" in inspect.signature(Cache.__init__).parameters, _entry("cache_layers")
    built = DynamicCache(config=tiny_llama().config)
    assert [type(layer) for layer in built.layers] == [DynamicLayer] * 2, _entry("cache_layers")


def test_cache_layers_overallocated_layer_writes_in_place():
    """Within capacity no update moves the buffer; growth (by CHUNK_ENTRIES) keeps every entry; truncation moves the
    fill pointer only; a reset empties the layer."""
    g = torch.Generator().manual_seed(1)
    layer, chunk = hf_compat.OverallocatedLayer(), hf_compat.CHUNK_ENTRIES
    k, v = torch.randn(2, 3, 10, 8, generator=g), torch.randn(2, 3, 10, 8, generator=g)
    keys, values = layer.update(k, v)
    assert layer.capacity == chunk and torch.equal(keys, k) and torch.equal(values, v)
    pointers = keys.data_ptr(), values.data_ptr()
    for _ in range(chunk - 11):  # fills the buffer up to one spare entry
        k1, v1 = torch.randn(2, 3, 1, 8, generator=g), torch.randn(2, 3, 1, 8, generator=g)
        k, v = torch.cat([k, k1], dim=-2), torch.cat([v, v1], dim=-2)
        keys, values = layer.update(k1, v1)
        assert (keys.data_ptr(), values.data_ptr()) == pointers, "an update within capacity moved the buffer"
    assert torch.equal(keys, k) and torch.equal(values, v) and layer.get_seq_length() == chunk - 1
    k3, v3 = torch.randn(2, 3, 3, 8, generator=g), torch.randn(2, 3, 3, 8, generator=g)
    keys, values = layer.update(k3, v3)  # past capacity: one move to the next multiple of the chunk
    assert layer.capacity == 2 * chunk and keys.data_ptr() != pointers[0]
    assert torch.equal(keys, torch.cat([k, k3], dim=-2)) and torch.equal(values, torch.cat([v, v3], dim=-2))
    pointers = keys.data_ptr(), values.data_ptr()
    layer.truncate(7)
    assert layer.get_seq_length() == 7 and layer.capacity == 2 * chunk
    assert (layer.keys.data_ptr(), layer.values.data_ptr()) == pointers and torch.equal(
        layer.keys, k[:, :, :7]
    )
    keys, _ = layer.update(k3, v3)  # over the dropped entries
    assert keys.data_ptr() == pointers[0] and torch.equal(keys, torch.cat([k[:, :, :7], k3], dim=-2))
    with pytest.raises(ValueError, match="rows"):
        layer.update(k3[:1], v3[:1])
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized and layer.capacity == 0
    keys, _ = layer.update(k3[:1], v3[:1])  # a reset layer takes any batch again
    assert torch.equal(keys, k3[:1]) and layer.capacity == chunk


def test_cache_layers_overallocate_layers_only_touches_empty_plain_caches():
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    for cache in (DynamicCache(), DynamicCache(config=tiny_llama().config)):
        assert hf_compat.overallocate_layers(cache), _entry("cache_layers")
        assert all(type(layer) is hf_compat.OverallocatedLayer for layer in cache.layers)
        with torch.no_grad():
            tiny_llama()(torch.tensor([[1, 5, 6]]), past_key_values=cache, use_cache=True)
        assert len(cache.layers) == 2 and cache.get_seq_length() == 3
        assert all(type(layer) is hf_compat.OverallocatedLayer for layer in cache.layers), _entry(
            "cache_layers"
        )
    full = DynamicCache()
    with torch.no_grad():
        tiny_llama()(torch.tensor([[1, 5, 6]]), past_key_values=full, use_cache=True)
    sliding = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=8)])
    offloaded = DynamicCache()
    offloaded.offloading = True  # what DynamicCache(offloading=True) sets (it needs an accelerator's streams)
    for cache in (full, sliding, offloaded):
        kinds = [type(layer) for layer in cache.layers]
        assert not hf_compat.overallocate_layers(cache) and [type(layer) for layer in cache.layers] == kinds


def test_cache_argument(monkeypatch):
    """``generate`` keeps the cache in its ``model_kwargs`` under ``CACHE_ARGUMENT`` (what a ``custom_generate`` loop
    and the assisted loop receive, and what the tree loops read), and the model's forward, its decoder layers' and their
    attention modules take it by that name."""
    from transformers.cache_utils import Cache

    name = hf_compat.CACHE_ARGUMENT
    target = tiny_llama()
    for fn in (GenerationMixin.prepare_inputs_for_generation, target.forward, target.model.forward,
               target.model.layers[0].forward, target.model.layers[0].self_attn.forward):  # fmt: skip
        assert name in inspect.signature(fn).parameters, f"{_entry('cache_argument')}: {fn.__qualname__}"
    seen = []

    def probe(model, input_ids, *args, **model_kwargs):  # a custom_generate loop sees generate's model_kwargs
        seen.append(model_kwargs.get(name))
        return input_ids

    target.generate(torch.tensor([[1, 5, 6, 7]]), max_new_tokens=4, do_sample=False, custom_generate=probe)
    assert seen and all(isinstance(c, Cache) for c in seen), f"{_entry('cache_argument')}: {seen}"
    assert hf_compat.cache_of({"past_key_values": seen[0]}) is seen[0]  # a direct caller's old name
    # generate's output holds the cache in a field of that name (what the custom_generate loops return)
    fields = [f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)]
    assert name in fields, f"{_entry('cache_argument')}: GenerateDecoderOnlyOutput has {fields}"


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3", "phi3"])
def test_decoder_layers(arch):
    """The layer conventions GLIDE rebuilds: submodule names, the attention call and scaling, the rotary call."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model(
        arch, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, vocab_size=50, pad_token_id=0, attn_implementation="sdpa",
    )  # fmt: skip
    if arch == "gemma3_text":  # one layer of each kind, as in the real model
        cfg = AutoConfig.for_model(**{**cfg.to_dict(), "num_hidden_layers": 2,
                                      "layer_types": ["sliding_attention", "full_attention"]})  # fmt: skip
    base = AutoModel.from_config(cfg).eval()
    parts = hf_compat.decoder_layer_parts(base.layers[0], "test")
    assert set(hf_compat.LAYER_PARTS) <= set(parts), _entry("decoder_layers")
    assert (hf_compat.SANDWICH_NORMS[0] in parts) == (arch == "gemma3_text"), _entry("decoder_layers")
    assert isinstance(parts["self_attn"].scaling, float), f"{_entry('decoder_layers')}: attention.scaling"
    x, ids = torch.randn(1, 3, 32), torch.arange(3)[None]
    cos_sin = hf_compat.rotary_for_layer_type(base.rotary_emb)(x, ids)
    out = hf_compat.attention_module_call(parts["self_attn"], x, cos_sin, None, None)
    assert out.shape == x.shape, _entry("decoder_layers")
    with pytest.raises(SpecDecError, match="cannot build a layer like"):
        hf_compat.decoder_layer_parts(torch.nn.Linear(2, 2), "test")


# ------------------------------------------------------------------ the assisted hook
def test_batch_hook_passes_every_argument_through(monkeypatch):
    """A transformers release that adds a parameter to the assisted loop: a call with another assistant is passed on
    as is, at any batch size. One that renames a parameter the wrapper reads: a call with our drafter is a
    SpecDecError naming the entry, not a wrong call."""
    seen = []

    def future(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
               streamer=None, inputs_tensor=None, assistant_model=None, added_in_a_future_release=None,
               **model_kwargs):  # fmt: skip
        seen.append((input_ids.shape[0], assistant_model, added_in_a_future_release, model_kwargs))

    monkeypatch.setattr(hf_compat, "ORIGINAL_ASSISTED_DECODING", future)
    monkeypatch.setattr(assisted, "ORIGINAL_ASSISTED_DECODING", future)
    model = tiny_llama()
    one, two = torch.ones(1, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    assisted._assisted_decoding(
        model, one, None, None, "cfg", assistant_model=tiny_llama(seed=1), added_in_a_future_release=2, x=3
    )
    assisted._assisted_decoding(
        model, two, None, None, "cfg", assistant_model="other", added_in_a_future_release=4
    )
    assert [s[:1] + s[2:] for s in seen] == [(1, 2, {"x": 3}), (2, 4, {})]

    def renamed(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                text_streamer=None, assistant_model=None, **model_kwargs):  # fmt: skip
        raise AssertionError("not reached")

    monkeypatch.setattr(hf_compat, "ORIGINAL_ASSISTED_DECODING", renamed)
    monkeypatch.setattr(assisted, "ORIGINAL_ASSISTED_DECODING", renamed)
    with pytest.raises(SpecDecError, match=r"\['streamer'\].*assisted_decoding"):
        assisted._assisted_decoding(model, one, None, None, "cfg", assistant_model=_glide(model))


def test_batch_with_another_assistant_keeps_transformers_error():
    """No silent change: a batch with an assistant that is not an hf_specdec drafter reaches transformers' own loop,
    which refuses it as before."""
    target = tiny_llama()
    ids = torch.tensor([[0, 5, 6], [4, 5, 6]])
    with pytest.raises(ValueError, match="batch_size = 1"):
        target.generate(
            ids,
            attention_mask=(ids != 0).long(),
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=0,
            assistant_model=tiny_llama(seed=1),
        )


def test_our_drafter_without_our_loop_raises(monkeypatch):
    """Simulated mismatch: transformers' assisted loop runs without the wrapper, so the drafter reaches the generic
    assisted generator; that is a SpecDecError, not a silent fallback."""
    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", hf_compat.ORIGINAL_ASSISTED_DECODING)
    target = tiny_llama()
    with pytest.raises(SpecDecError, match="ran its own assisted loop"):
        target.generate(
            torch.tensor([[1, 5, 6]]), max_new_tokens=3, do_sample=False, assistant_model=_glide(target)
        )


def test_our_drafter_with_prompt_lookup_raises():
    target = tiny_llama()
    with pytest.raises(SpecDecError, match="prompt_lookup_num_tokens"):
        target.generate(
            torch.tensor([[1, 5, 6]]),
            max_new_tokens=3,
            assistant_model=_glide(target),
            prompt_lookup_num_tokens=2,
        )
