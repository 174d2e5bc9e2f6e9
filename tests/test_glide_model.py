"""GLIDE drafter (GLIDE, arXiv:2402.02082, §4.1): block-wise mask, cross-attention under GQA/RoPE, checkpoints, assisted loop."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM
from hf_specdec.modeling.masks import blockwise_cross_mask
from safetensors import safe_open

import hf_specdec
from hf_specdec import assisted
from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama


def _drafter(target, seed: int = 0, **kw) -> GlideForCausalLM:
    torch.manual_seed(seed)
    d = GlideForCausalLM(GlideConfig.for_target(target, **kw)).attach_target(target).eval()
    d.init_from_target(target)
    for layer in d.layers:  # give the cross-attention a non-zero W^O so it matters in these tests
        if hasattr(layer, "cross_attn"):
            torch.nn.init.normal_(layer.cross_attn.o_proj.weight, std=0.05)
    return d


# ------------------------------------------------------------------ block-wise mask (§4.1)
def test_blockwise_mask_is_block_j_greater_than_block_k():
    m = blockwise_cross_mask(7, block_size=3)
    for j in range(7):
        for k in range(7):
            assert bool(m[j, k]) == (j // 3 > k // 3)
    assert not blockwise_cross_mask(10, 5)[:5].any()  # the first block sees no target cache
    assert not blockwise_cross_mask(10, 5).diagonal().any()  # never the own position (nor later ones)
    with pytest.raises(ValueError):
        blockwise_cross_mask(4, 0)


# ------------------------------------------------------------------ cross-attention under GQA and RoPE
def test_cross_attention_shapes_and_values_under_gqa():
    target = tiny_llama()  # 4 query heads over 2 KV heads, head_dim 16
    d = _drafter(target)
    ca = d.layers[0].cross_attn
    assert ca.q_proj.weight.shape == (4 * 16, 64) and ca.o_proj.weight.shape == (64, 4 * 16)
    ids = torch.randint(3, 97, (2, 9))
    cache = target(ids, use_cache=True).past_key_values
    keys, values = (
        cache.layers[d.config.target_layers[0]].keys,
        cache.layers[d.config.target_layers[0]].values,
    )
    assert keys.shape == (2, 2, 9, 16)
    x = torch.randn(2, 3, 64)
    pos = torch.tensor([[9, 10, 11]] * 2)
    cos, sin = d.__dict__["_rotary"](x, pos)
    out = ca(x, (cos, sin), keys, values, None)
    assert out.shape == (2, 3, 64)
    # reference: each query head j uses KV head j // 2 (GQA grouping), queries rotated at their own positions
    q = ca.q_proj(x).view(2, 3, 4, 16).transpose(1, 2)
    rot = torch.cat((-q[..., 8:], q[..., :8]), -1)
    q = q * cos[:, None] + rot * sin[:, None]
    k, v = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)
    ref = torch.softmax(q @ k.transpose(-1, -2) / 16**0.5, -1) @ v
    torch.testing.assert_close(out, ca.o_proj(ref.transpose(1, 2).reshape(2, 3, 64)), rtol=1e-4, atol=1e-5)


def test_cross_attention_depends_on_relative_positions_only():
    """Keys are cached after RoPE: shifting keys and queries by the same offset must not change the output."""
    target = tiny_llama()
    d = _drafter(target)
    ca = d.layers[0].cross_attn
    raw_k, v, x = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 64)
    outs = []
    for offset in (0, 37):
        kpos = torch.arange(offset, offset + 6)[None]
        cos_k, sin_k = d.__dict__["_rotary"](x, kpos)
        k = raw_k * cos_k[:, None] + torch.cat((-raw_k[..., 8:], raw_k[..., :8]), -1) * sin_k[:, None]
        qpos = torch.tensor([[offset + 6, offset + 7]])
        outs.append(ca(x, d.__dict__["_rotary"](x, qpos), k, v, None))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)


def test_training_mask_matches_inference_delay():
    """With the block-wise mask, the draft at position j sees exactly what inference would see with the target's
    cache ending at j's block start: training and inference agree (the point of §4.1's mask)."""
    target = tiny_llama()
    d = _drafter(target, block_size=4)
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        cache = target(ids, use_cache=True).past_key_values
        train = d.hidden_states(
            ids, target_past_key_values=cache, cross_attention_mask=blockwise_cross_mask(12, 4)
        )
        for j in (5, 9, 11):
            start = j // 4 * 4
            prefix = target(ids[:, :start], use_cache=True).past_key_values
            infer = d.hidden_states(ids[:, : j + 1], target_past_key_values=prefix)
            torch.testing.assert_close(train[:, j], infer[:, j], rtol=1e-4, atol=1e-5)
        # and the glimpse matters: without the target cache the output differs
        alone = d.hidden_states(ids)
        assert not torch.allclose(train[:, 9], alone[:, 9], atol=1e-4)


# ------------------------------------------------------------------ checkpoints
def test_save_load_round_trip_is_bit_exact_and_stores_no_target_weights(tmp_path):
    target = tiny_llama()
    d = _drafter(target, draft_vocab_size=40)
    d.set_draft_vocab(torch.arange(2, 42))
    d.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "draft_vocab_ids" in keys and not any("embed" in k or "lm_head" in k for k in keys)
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path, target=target)
    assert type(back) is GlideForCausalLM
    for (k1, v1), (k2, v2) in zip(d.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2), k1
    ids = torch.randint(3, 97, (1, 8))
    cache = target(ids[:, :5], use_cache=True).past_key_values
    with torch.no_grad():
        assert torch.equal(
            d(ids, target_past_key_values=cache).logits, back(ids, target_past_key_values=cache).logits
        )


def test_wrong_target_is_a_clear_error(tmp_path):
    target = tiny_llama()
    _drafter(target).save_pretrained(tmp_path)
    other = tiny_llama(seed=1)
    with pytest.raises(SpecDecError, match="built for target"):
        GlideForCausalLM.from_pretrained(tmp_path, target=other)
    lone = GlideForCausalLM.from_pretrained(tmp_path)  # loads, but tells what to do when used
    with pytest.raises(SpecDecError, match="attach_target"):
        lone(torch.tensor([[3, 4]]))
    with pytest.raises(SpecDecError, match="built for target"):
        other.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, assistant_model=lone)


# ------------------------------------------------------------------ target.generate(assistant_model=glide)
@pytest.mark.parametrize("kw", [{}, {"cross_attention": False}, {"draft_vocab_size": 50}])
def test_greedy_assisted_output_equals_plain_greedy(kw):
    assert assisted.installed() and hf_specdec.SpecDecError
    target = tiny_llama()
    d = _drafter(target, **kw)
    if kw.get("draft_vocab_size"):
        d.set_draft_vocab(torch.arange(47, 97))
    for seed in range(2):
        torch.manual_seed(seed)
        ids = torch.randint(3, 97, (1, 6 + seed))
        plain = target.generate(ids, max_new_tokens=16, do_sample=False)
        fast = target.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=d)
        assert torch.equal(plain, fast)


def test_drafts_come_from_the_glide_generator_and_use_the_target_cache():
    target = tiny_llama()
    d = _drafter(target)
    d.generation_config.num_assistant_tokens = 3
    d.chain_cost = False  # all gamma drafts (and no drafter-cost timing forwards through the spy)
    seen = []
    orig = d.hidden_states

    def spy(ids, positions=None, cache=None, target_past_key_values=None, **k):
        seen.append((ids.shape[1], target_past_key_values.get_seq_length(), int(positions[0, 0])))
        return orig(ids, positions, cache, target_past_key_values=target_past_key_values, **k)

    d.hidden_states = spy
    target.generate(torch.randint(3, 97, (1, 5)), max_new_tokens=10, do_sample=False, assistant_model=d)
    assert seen, "the GLIDE candidate generator was not used"
    # every draft forward reads the verified target cache (non-empty: round one is the target's prefill), and
    # drafts at most gamma - 1 positions past its end (a round feeds the bonus token at position t, then drafts)
    assert seen[0][2] == 0 and all(t > 0 and pos - t <= 2 for _, t, pos in seen)
    assert max(n for n, _, _ in seen) <= 7  # catch-up tokens + bonus token, never the whole sequence again


def test_sampling_keeps_the_target_distribution():
    """Speculative sampling with the vanilla drafter drafting the first token: the first new token must follow
    the target's distribution (chi-square over a 4-token vocabulary)."""
    from scipy.stats import chisquare

    target = tiny_llama(vocab_size=4, num_hidden_layers=1)
    d = _drafter(target, seed=3, cross_attention=False)
    torch.nn.init.normal_(d.layers[0].mlp.down_proj.weight, std=0.5)  # a poor drafter: many rejections
    ids = torch.tensor([[3, 1, 3, 2]])  # no pad token (0): generate would infer padding from it
    with torch.no_grad():
        p = target(ids).logits[0, -1].softmax(-1)
    torch.manual_seed(0)
    n = 160
    counts = torch.zeros(4)
    for _ in range(n):
        out = target.generate(ids, max_new_tokens=2, do_sample=True, top_k=0, assistant_model=d)
        counts[out[0, 4]] += 1
    keep = p * n >= 5
    stat = chisquare(counts[keep].numpy(), (p[keep] / p[keep].sum() * counts[keep].sum()).numpy())
    assert stat.pvalue > 1e-3, (counts, p * n)


@pytest.mark.real
@pytest.mark.compat
def test_real_target_greedy_assisted_is_identical(real_target):
    model, tok = real_target
    d = _drafter(model, draft_vocab_size=4096)
    d.set_draft_vocab(torch.arange(4096))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    plain = model.generate(ids, max_new_tokens=40, do_sample=False)
    fast = model.generate(ids, max_new_tokens=40, do_sample=False, assistant_model=d)
    assert torch.equal(plain, fast)
