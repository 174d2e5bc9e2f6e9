"""GLIDE training/inference consistency (GLIDE, arXiv:2402.02082, §4.1) and the cross-attention's training signal.

- Training (one forward over a whole sequence, block-wise cross mask) must give, position by position, the logits
  inference gives when the drafter drafts token by token with the target cache cut where a verification would cut
  it, through the inference code path (``GlideDraftCache``), also for a 2-layer drafter.
- Inside transformers' real assisted loop, every draft forward sees the target cache of positions ``< t`` (the
  bonus token x_t not in it), and the drafted logits equal the training forward under the "verified prefix" mask.
- The trainer hands the drafter the target's KV of the same (unshifted) sequence, and the cross-attention's
  projections receive finite, non-zero gradients (the block-0 rows, which see no target key, give no NaN).
- RoPE / GQA / scaling follow the target's own convention: with the target layer's W_q, W_O and input, the
  cross-attention reproduces that layer's self-attention output.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM
from hf_specdec.modeling.masks import blockwise_cross_mask
from hf_specdec.trainers.drafters.trainer import DrafterTrainer

from hf_specdec.glide.draft_cache import GlideDraftCache

from .conftest import tiny_llama


def _drafter(target, layers: int = 1, block_size: int = 5, seed: int = 0) -> GlideForCausalLM:
    torch.manual_seed(seed)
    cfg = GlideConfig.for_target(target, num_hidden_layers=layers, block_size=block_size)
    d = GlideForCausalLM(cfg).attach_target(target).eval()
    d.init_from_target(target)
    for layer in d.layers:  # a non-zero W^O, so the glimpse changes the output
        torch.nn.init.normal_(layer.cross_attn.o_proj.weight, std=0.1)
    return d


def _train_logits(d, target, ids, mask):
    with torch.no_grad():
        cache = target(ids, use_cache=True).past_key_values
        return d.draft_logits(d.hidden_states(ids, target_past_key_values=cache, cross_attention_mask=mask))


@pytest.mark.parametrize("layers", [1, 2])
def test_block_mask_training_equals_token_by_token_inference(layers):
    """Rounds start at block boundaries (bonus token x_t at t = b L, target cache = positions < t); the drafter
    is fed the true tokens one at a time through the inference cache, as if every draft were accepted."""
    L, n = 4, 14
    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, layers, block_size=L)
    ids = torch.randint(3, 97, (1, n))
    train = _train_logits(d, target, ids, blockwise_cross_mask(n, L))
    with torch.no_grad():
        full = target(ids, use_cache=True).past_key_values
        state = GlideDraftCache(d)
        infer = []
        for start in range(0, n, L):
            verified = copy.deepcopy(full)
            verified.crop(start - n)  # what the verification leaves: positions < start
            assert verified.get_seq_length() == start
            state.sync(ids[:, : start + 1])
            for p in range(start, min(start + L, n)):
                infer.append(state.step(ids[:, p : p + 1], verified))
    infer = torch.cat(infer)
    torch.testing.assert_close(train[0], infer, rtol=1e-4, atol=1e-5)
    # the test can fail: one position more (the bonus token's own KV) or one block less changes the logits
    for wrong in (
        blockwise_cross_mask(n, L) | torch.eye(n, dtype=torch.bool),
        blockwise_cross_mask(n, 2 * L),
    ):
        assert not torch.allclose(_train_logits(d, target, ids, wrong)[0], infer, atol=1e-4)


def test_assisted_loop_drafts_equal_training_forward_under_the_verified_prefix_mask():
    """Spy on the real loop (target.generate(assistant_model=glide)): the target cache handed to the drafter ends
    right before the bonus token, and each drafted position's logits (1-layer drafter, whose output at p depends
    only on tokens <= p and the visible target KV) equal one training forward over the final sequence where query
    p sees the target positions k < t of its round."""
    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, 1)
    d.generation_config.num_assistant_tokens, d.chain_cost = 3, False  # gamma drafts every step
    rounds = []
    sync, step = GlideDraftCache.sync, GlideDraftCache.step

    def spy_sync(
        self, input_ids
    ):  # a step's start: t = position of the bonus token (the last committed token)
        rounds.append((input_ids.shape[1] - 1, []))
        return sync(self, input_ids)

    def spy_step(self, step_ids, target_cache, **kw):
        t = rounds[-1][0]
        assert target_cache.get_seq_length() == t  # the target's cache ends right before the bonus token
        logits = step(self, step_ids, target_cache, **kw)
        rounds[-1][1].append((self.fed.clone(), logits))  # tokens fed so far; the last one predicts
        return logits

    prompt = torch.randint(3, 97, (1, 6))
    GlideDraftCache.sync, GlideDraftCache.step = spy_sync, spy_step
    try:
        out = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=d)
    finally:
        GlideDraftCache.sync, GlideDraftCache.step = sync, step
    assert torch.equal(out, target.generate(prompt, max_new_tokens=24, do_sample=False))
    n = out.shape[1]
    checked = 0
    for t, steps in rounds:
        if not steps:
            continue
        visible = torch.zeros(n, n, dtype=torch.bool)
        visible[:, :t] = True
        train = _train_logits(d, target, out, visible)[0]
        for fed, logits in steps:
            p = len(fed) - 1
            assert (
                p >= t
            )  # the predicting token is the bonus token or a draft, never inside the verified prefix
            if p < n and torch.equal(
                fed, out[0, : p + 1]
            ):  # its inputs were all committed (no rejected draft)
                torch.testing.assert_close(logits[0], train[p].float(), rtol=1e-4, atol=1e-5)
                checked += 1
    assert checked >= 5


def test_trainer_feeds_the_same_sequence_kv_and_cross_attention_gets_gradients(tmp_path):
    from transformers import TrainingArguments

    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, 1).train()
    ids = torch.randint(3, 97, (2, 16))
    labels = ids.clone()
    labels[:, :3] = -100
    seen = {}
    original = d.hidden_states

    def spy(*args, **kwargs):
        seen.update(inspect.signature(original).bind(*args, **kwargs).arguments)
        return original(*args, **kwargs)

    d.hidden_states = spy
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1)
    trainer = DrafterTrainer(model=d, args=args, target=target)
    loss = trainer.compute_loss(d, {"input_ids": ids, "labels": labels})
    loss.backward()
    # the KV the drafter reads is the target's KV of this very batch (same tokens, same positions), top layer
    ref = target(ids, use_cache=True).past_key_values.layers[2]
    keys, values = seen["target_past_key_values"][d.config.target_layers[0]]
    assert d.config.target_layers == [2] and torch.equal(seen["input_ids"], ids)
    torch.testing.assert_close(keys, ref.keys)
    torch.testing.assert_close(values, ref.values)
    assert not keys.requires_grad
    assert torch.equal(seen["cross_attention_mask"], blockwise_cross_mask(16, 5))
    ca = d.layers[0].cross_attn
    for p in (ca.q_proj.weight, ca.o_proj.weight, d.layers[0].cross_layernorm.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert all(not p.requires_grad for p in target.parameters())


def test_cross_attention_with_the_targets_own_weights_reproduces_the_targets_attention():
    """RoPE / GQA / scaling / mask orientation as the target has them: a cross-attention given the target layer's
    own W_q and W_O, its own normed input as queries and the causal mask ``k <= j`` returns exactly the output of
    that target layer's self-attention (which computed the cached keys/values being read)."""
    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, 1)
    layer = d.config.target_layers[0]
    src = target.model.layers[layer].self_attn
    ca = d.layers[0].cross_attn
    with torch.no_grad():
        ca.q_proj.weight.copy_(src.q_proj.weight)
        ca.o_proj.weight.copy_(src.o_proj.weight)
    seen = {}
    h1 = src.register_forward_hook(
        lambda m, args, kwargs, out: seen.update(x=kwargs["hidden_states"], out=out[0]), with_kwargs=True
    )
    ids = torch.randint(3, 97, (2, 11))
    try:
        with torch.no_grad():
            cache = target(ids, use_cache=True).past_key_values
    finally:
        h1.remove()
    n = ids.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    pos = torch.arange(n)[None].expand(2, n)
    entry = cache.layers[layer]
    with torch.no_grad():
        out = ca(seen["x"], d.__dict__["_rotary"](seen["x"], pos), entry.keys, entry.values, causal)
    torch.testing.assert_close(out, seen["out"], rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # and it can fail: queries rotated one position off
        off = ca(seen["x"], d.__dict__["_rotary"](seen["x"], pos + 1), entry.keys, entry.values, causal)
    assert not torch.allclose(off, seen["out"], atol=1e-4)


@pytest.mark.parametrize("loop", ["chain", "cape"])
def test_the_drafter_cache_keeps_every_fed_token_that_was_committed(loop):
    """``GlideDraftCache`` knows which fed tokens are still valid from lengths alone (the committed ones, then the
    drafts the verification accepted), without reading the tokens. At every round it must keep exactly the longest
    prefix of the committed sequence that it was fed: fewer re-feeds accepted drafts, more keeps a rejected one."""
    import hf_specdec

    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, 1)
    d.generation_config.num_assistant_tokens, d.chain_cost = 3, False  # gamma drafts every round
    checked = []
    original = GlideDraftCache.sync

    def sync(self, input_ids):
        fed, ids = self.fed.tolist(), input_ids[0, :-1].tolist()
        common = next((i for i, (a, b) in enumerate(zip(fed, ids)) if a != b), min(len(fed), len(ids)))
        keep = original(self, input_ids)
        checked.append((keep, common))
        return keep

    GlideDraftCache.sync = sync
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=30, min_new_tokens=30, do_sample=False)
    try:
        if loop == "chain":
            out = target.generate(prompt, assistant_model=d, **kw)
        else:
            out = target.generate(
                prompt, custom_generate=hf_specdec.glide_cape, drafter=d, cape_cost=False, **kw
            )
    finally:
        GlideDraftCache.sync = original
    assert torch.equal(out, target.generate(prompt, **kw))
    assert len(checked) > 3 and all(keep == common for keep, common in checked), checked
    assert any(keep > 0 for keep, _ in checked)


def test_the_drafter_cache_syncs_without_reading_the_device():
    """Its bookkeeping is lengths on the host: cropping to the committed tokens reads no tensor (on a GPU each such
    read would stall the loop; core/host_syncs.py)."""
    from hf_specdec.core.host_syncs import HostSyncCounter

    target = tiny_llama(num_hidden_layers=3)
    d = _drafter(target, 1)
    ids = torch.randint(3, 97, (1, 9))
    cache = target(ids[:, :6], use_cache=True).past_key_values
    state = GlideDraftCache(d)
    state.step(ids[:, :6], cache)
    state.step(ids[:, 6:7], cache, draft=True)
    state.step(ids[:, 7:8], cache, draft=True)
    with HostSyncCounter() as syncs:
        state.accepted(1)
        keep = state.sync(ids)
    assert syncs.total == 0, syncs.by_kind
    assert keep == 7 and state.cache.get_seq_length() == 7 and torch.equal(state.fed, ids[0, :7])
