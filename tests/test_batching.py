"""Batched speculative decoding (``core/batch_decoding.py``, ``core/ragged_cache.py``): every row of a
left-padded batch equals generating that row alone, rows accept different counts in one step, rows end on their
own, a batch of one is today's path, sampling follows the target per row, and bad batches get clear errors."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

import hf_specdec
from hf_specdec.core import ragged_cache
from hf_specdec.core.ragged_cache import RaggedCache
from hf_specdec.core.stats import DecodeStats, ForwardMeter
from hf_specdec.core.tree import TokenTree
from hf_specdec.core.tree_decoding import TreeProposer, tree_generate
from hf_specdec.errors import SpecDecError
from hf_specdec.pld_plus.candidate_generator import PLDPlusCandidateGenerator
from hf_specdec.pld_plus.proposer import PLDPlusProposer

from .conftest import (
    CollectStreamer,
    assert_pairs_follow_target,
    batch_pair_counts,
    left_pad,
    tiny_gpt2,
    tiny_llama,
    warped_next_token,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def prompts_of(lengths, seed: int = 0, vocab: int = 97) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g) for n in lengths]


class RowOracle(TreeProposer):
    """Random trees around each row's true continuation (found by the row's prompt among ``refs``): a chain of the
    reference tokens, each corrupted with probability 0.3, plus random nodes, so rows accept different counts."""

    def __init__(self, refs: list[list[int]], seed: int):
        self.refs, self.seed, self.accepted = refs, seed, []

    def start(self, model, input_ids, generation_config):
        self.rng = random.Random(self.seed * 1000 + input_ids.shape[1])
        self.ref = next(r for r in self.refs if r[: input_ids.shape[1]] == input_ids[0].tolist())
        self.accepted = []  # this row's accepted count per step

    def propose(self, input_ids, max_depth):
        n, rng = input_ids.shape[1], self.rng
        adds = [(rng.randint(-1, i - 1), rng.randrange(3, 97)) for i in range(rng.randint(0, 6))]
        parent = -1
        for t in self.ref[n : n + rng.randint(0, 6)]:
            adds.append((parent, rng.randrange(3, 97) if rng.random() < 0.3 else t))
            parent = len(adds) - 1
        return TokenTree.from_additions(adds) if adds else TokenTree.empty()

    def observe(self, feedback):
        if not feedback.is_prefill:
            self.accepted.append(feedback.num_accepted)


def alone(model, prompt: torch.Tensor, n: int, **kw) -> list[int]:
    return model.generate(prompt[None], max_new_tokens=n, do_sample=False, **kw)[0].tolist()


@pytest.mark.parametrize("make,impl", [(tiny_llama, "sdpa"), (tiny_llama, "eager"), (tiny_gpt2, "sdpa")])
def test_each_row_equals_the_row_alone(make, impl):
    model = make()
    model.set_attn_implementation(impl)
    for seed in range(3):
        prompts = prompts_of((5, 11, 3, 8), seed)
        refs = [alone(model, p, 24) for p in prompts]
        ids, mask = left_pad(prompts)
        stats = DecodeStats()
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=24,
            do_sample=False,
            pad_token_id=0,
            custom_generate=tree_generate,
            proposer=RowOracle(refs, seed),
            stats=stats,
        )
        assert out.shape == (4, ids.shape[1] + 24)
        for i, p in enumerate(prompts):
            assert out[i, ids.shape[1] - len(p) :].tolist() == refs[i], (seed, i)
        assert stats.accepted > 0 and stats.new_tokens == 4 * 24
        assert stats.target_forwards == sum(s["rows"] for s in stats.steps)
        assert stats.batched_forwards == len(stats.steps) < 24


def test_rows_accept_different_counts_in_one_step():
    model = tiny_llama()
    prompts = prompts_of((4, 9, 6))
    refs = [alone(model, p, 20) for p in prompts]
    proposer = RowOracle(refs, 1)
    rows = []
    original_start = RowOracle.start

    def recording_start(self, *args):
        original_start(self, *args)
        rows.append(self)

    ids, mask = left_pad(prompts)
    RowOracle.start = recording_start
    try:
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            custom_generate=tree_generate,
            proposer=proposer,
        )
    finally:
        RowOracle.start = original_start
    per_row = [r.accepted for r in rows[1:]]  # rows[0]: the one-time start of the given proposer
    steps = min(len(a) for a in per_row)
    assert any(
        len({a[s] for a in per_row}) == len(per_row) for s in range(steps)
    )  # all different in one step


def test_a_row_that_ends_early_leaves_the_batch():
    model = tiny_llama()
    prompts = prompts_of((5, 7, 4), seed=2)
    free = [alone(model, p, 16) for p in prompts]
    eos = free[0][len(prompts[0]) + 2]  # row 0's third new token (or an earlier one equal to it) ends it
    refs = [alone(model, p, 16, eos_token_id=eos, pad_token_id=0) for p in prompts]
    assert len(refs[0]) <= len(prompts[0]) + 3 and max(len(r) for r in refs) > len(refs[0])
    ids, mask = left_pad(prompts)
    stats = DecodeStats()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=16,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        custom_generate=tree_generate,
        proposer=RowOracle(refs, 3),
        stats=stats,
    )
    plain = model.generate(
        ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    for i, p in enumerate(prompts):
        row = out[i, ids.shape[1] - len(p) :].tolist()
        assert row[: len(refs[i])] == refs[i]
        assert set(row[len(refs[i]) :]) <= {0}  # padded after EOS, as plain batched generate does
    assert out.shape[1] == plain.shape[1]
    assert stats.steps[-1]["rows"] < len(prompts)  # finished rows stopped costing compute


def test_a_batch_of_one_keeps_its_cache_packed(monkeypatch):
    """One loop serves every batch size; a batch of one keeps its cache in sequence order (no ragged layout, no
    holes), so it takes a caller's cache and every ``generate`` output."""
    model = tiny_llama()
    prompt = prompts_of((7,))[0]
    ref = alone(model, prompt, 12)

    def refuse(*args, **kwargs):
        raise AssertionError("batch size 1 must not lay its cache out as ragged rows")

    monkeypatch.setattr("hf_specdec.core.tree_decoding.RaggedCache", refuse)
    stats = DecodeStats()
    out = model.generate(
        prompt[None],
        max_new_tokens=12,
        do_sample=False,
        custom_generate=tree_generate,
        proposer=RowOracle([ref], 0),
        stats=stats,
    )
    assert out[0].tolist() == ref
    assert stats.batched_forwards == stats.target_forwards == len(stats.steps) < 12  # drafts were accepted


@pytest.mark.parametrize("rows", [1, 3])
def test_no_timing_sync_unless_stats_are_asked_for(monkeypatch, rows):
    """The loop times its forwards and drafts only for a ``stats`` (``timing.clock`` waits for the device): without
    one it never calls ``clock``, at batch 1 and in a batch; with one it does."""
    model = tiny_llama()
    prompts = prompts_of((7, 4, 9)[:rows])
    refs = [alone(model, p, 10) for p in prompts]
    ids, mask = left_pad(prompts)
    calls = []
    monkeypatch.setattr("hf_specdec.core.tree_decoding.clock", lambda device: calls.append(device) or 0.0)
    kw = dict(
        attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0, custom_generate=tree_generate
    )
    out = model.generate(ids, proposer=RowOracle(refs, 0), **kw)
    assert [out[i, ids.shape[1] - len(p) :].tolist() for i, p in enumerate(prompts)] == refs
    assert calls == []
    model.generate(ids, proposer=RowOracle(refs, 0), stats=DecodeStats(), **kw)
    assert calls


def test_visible_padding_is_caught(monkeypatch):
    """The planted bug: pads visible to real tokens. The per-row check must fail."""
    model = tiny_llama()
    prompts = prompts_of((3, 10))
    refs = [alone(model, p, 8) for p in prompts]
    original = RaggedCache.prefill_inputs

    def leaky(self, attention_mask):
        positions, mask = original(self, attention_mask)
        causal = torch.ones(mask.shape[-2:], dtype=torch.bool).tril()
        return positions, mask | causal  # every earlier token visible, pads included

    monkeypatch.setattr(RaggedCache, "prefill_inputs", leaky)
    ids, mask = left_pad(prompts)
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        custom_generate=tree_generate,
        proposer=RowOracle(refs, 0),
    )
    assert out[0, ids.shape[1] - 3 :].tolist() != refs[0]


def test_repack_keeps_every_rows_entries():
    model = tiny_llama()
    cache = DynamicCache(config=model.config)
    ragged = RaggedCache(cache)
    ids, mask = left_pad(prompts_of((2, 5, 4)))
    positions, bool_mask = ragged.prefill_inputs(mask)
    from hf_specdec.core.tree import additive_mask

    model(
        ids,
        position_ids=positions,
        attention_mask=additive_mask(bool_mask, model.dtype),
        past_key_values=cache,
    )
    trees = [TokenTree.from_chain([5, 6, 7]), TokenTree.empty(), TokenTree.from_chain([8])]
    fed, positions, bool_mask = ragged.tree_inputs(trees, torch.tensor([9, 10, 11]))
    model(
        fed,
        position_ids=positions,
        attention_mask=additive_mask(bool_mask, model.dtype),
        past_key_values=cache,
    )
    ragged.keep([[0, 1, 2], [0], [0, 1]])
    assert ragged.lengths.tolist() == [5, 6, 6] and ragged.holes() > 0
    before = [[t.clone() for t in ragged.row_view(r)[0]] for r in range(3)]
    ragged.repack()
    assert ragged.valid.shape[1] == 6 and bool(ragged.valid[:, -5:].all())
    for r in range(3):
        assert all(torch.equal(a, b) for a, b in zip(before[r], ragged.row_view(r)[0]))
    ragged.select_rows(torch.tensor([2, 0]))
    assert ragged.lengths.tolist() == [6, 5] and torch.equal(ragged.row_view(1)[0][0], before[0][0])


def _pld_generator(model, k: int = 3):
    def make():
        return PLDPlusCandidateGenerator(
            "hidden",
            num_draft_tokens=k,
            max_length=200,
            layer=2,
            hidden_size=model.config.hidden_size,
            min_score=-1.0,
        )

    return make


def repetitive(n: int, seed: int) -> torch.Tensor:
    """A prompt that repeats itself, so PLD+ finds occurrences."""
    base = prompts_of((6,), seed)[0]
    return torch.cat([base, base, base])[:n]


def test_pld_plus_in_the_tree_core_replays_the_assisted_loop():
    """PLDPlusProposer at batch 1 (tree core) drafts as PLD+ in transformers' assisted loop: same tokens, same
    number of target forwards."""
    model = tiny_llama()
    prompt = repetitive(16, 4)[None]
    with ForwardMeter(model) as assisted:
        ref = model.generate(
            prompt,
            max_new_tokens=20,
            do_sample=False,
            custom_generate=hf_specdec.pld_plus,
            pld_num_tokens=3,
            pld_min_score=-1.0,
            pld_layer=2,
        )
    with ForwardMeter(model) as core:
        out = model.generate(
            prompt,
            max_new_tokens=20,
            do_sample=False,
            custom_generate=tree_generate,
            proposer=PLDPlusProposer(_pld_generator(model)),
        )
    assert torch.equal(out, ref) and core.calls == assisted.calls < 20 + 1


def test_pld_plus_takes_a_batch():
    model = tiny_llama()
    prompts = [repetitive(n, s) for n, s in ((12, 0), (17, 1), (9, 2))]
    refs = [alone(model, p, 16) for p in prompts]
    ids, mask = left_pad(prompts)
    stats = DecodeStats()
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=16,
        do_sample=False,
        pad_token_id=0,
        custom_generate=hf_specdec.pld_plus,
        pld_num_tokens=3,
        pld_min_score=-1.0,
        stats=stats,
    )
    for i, p in enumerate(prompts):
        assert out[i, ids.shape[1] - len(p) :].tolist() == refs[i]
    assert stats.drafted > 0 and stats.batched_forwards > 0


def test_sampling_follows_the_target_per_row():
    """Two rows of different prompt lengths, tokens 2-3 sampled through sampled trees with q: each row's pairs
    follow the target's joint distribution after that row's prompt."""
    pytest.importorskip("scipy.stats")
    vocab = 6
    model = tiny_llama(vocab_size=vocab, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    prompts = [torch.tensor([1, 4, 2]), torch.tensor([3, 5, 0, 2, 1])]
    temp, top_k = 0.8, 4
    target = warped_next_token(model, temp, top_k)

    class Sampler(TreeProposer):
        def propose(self, input_ids, max_depth):
            q = torch.full((vocab,), 1.0 / vocab)
            first = torch.multinomial(q, 2).tolist()
            q2 = q.clone()
            q2[first[0]] = 0
            q2 /= q2.sum()
            second = int(torch.multinomial(q, 1))
            return TokenTree.from_additions(
                [(-1, first[0]), (-1, first[1]), (0, second)], draft_probs=torch.stack([q, q2, q])
            )

    torch.manual_seed(0)
    counts = batch_pair_counts(
        model,
        prompts,
        500,
        vocab,
        temperature=temp,
        top_k=top_k,
        custom_generate=tree_generate,
        proposer=Sampler(),
    )
    for i, p in enumerate(prompts):
        assert_pairs_follow_target(counts[i], p[None], target)


def test_bad_batches_get_clear_errors():
    model = tiny_llama()
    prompts = prompts_of((3, 6))
    ids, mask = left_pad(prompts)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with pytest.raises(SpecDecError, match="LEFT-padded"):
        model.generate(
            ids.flip(1),
            attention_mask=mask.flip(1),
            custom_generate=tree_generate,
            proposer=TreeProposer(),
            **kw,
        )
    with pytest.raises(SpecDecError, match="streamer"):
        model.generate(
            ids,
            attention_mask=mask,
            custom_generate=tree_generate,
            proposer=TreeProposer(),
            specdec_streamer=CollectStreamer(),
            **kw,
        )
    with pytest.raises(SpecDecError, match="sequences only"):
        model.generate(
            ids,
            attention_mask=mask,
            custom_generate=tree_generate,
            proposer=TreeProposer(),
            return_dict_in_generate=True,
            output_scores=True,
            **kw,
        )
    with pytest.raises(SpecDecError, match="pld_variant='hidden'"):
        model.generate(
            ids, attention_mask=mask, custom_generate=hf_specdec.pld_plus, pld_variant="attention", **kw
        )
    with pytest.raises(SpecDecError, match="attention_mask"):
        config = GenerationConfig(max_new_tokens=4, pad_token_id=0)
        tree_generate(model, ids, proposer=TreeProposer(), generation_config=config)
    assert ragged_cache.REPACK_FRACTION < 1


def chat_batch(tok, texts: list[str]):
    """Left-padded chat prompts of different lengths, as a user batches them."""
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
        for t in texts
    ]
    side, tok.padding_side = tok.padding_side, "left"
    try:
        return tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side


EDIT_TEXTS = [
    "Rename x to total:\nx = 0\nfor v in values:\n    x += v\nprint(x)",
    "Fix the typo and repeat the sentence: The quick brwn fox jumps over the lazy dog.",
    "Make this a list comprehension:\nsquares = []\nfor i in range(10):\n    squares.append(i * i)\nprint(squares)",
]


@pytest.mark.real
@pytest.mark.compat
def test_pld_plus_batch_is_lossless_on_the_real_target(real_target):
    model, tok = real_target
    batch = chat_batch(tok, EDIT_TEXTS)
    assert len(set(batch.attention_mask.sum(1).tolist())) == 3  # three prompt lengths
    stats = DecodeStats()
    out = model.generate(
        **batch, max_new_tokens=32, do_sample=False, custom_generate=hf_specdec.pld_plus, stats=stats
    )
    width = batch.input_ids.shape[1]
    for i in range(3):
        ids = batch.input_ids[i][batch.attention_mask[i].bool()][None]
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
        new = ref[0, ids.shape[1] :].tolist()
        assert out[i, width : width + len(new)].tolist() == new, i
    assert stats.accepted > 0


def test_best_depth_cuts_a_lone_long_draft_but_keeps_shared_ones():
    """One forward verifies every row, padded to the widest tree: a draft that only one row makes must pay for the
    whole batch (batch_decoding.best_depth), drafts that every row makes share the width."""
    from hf_specdec.core.batch_decoding import best_depth
    from hf_specdec.core.verify_cost import CostCurve

    class Known(TreeProposer):
        def __init__(self, per_token: float, k: int):
            self.per_token, self.k = per_token, k

        def expected_tokens(self, depth):
            return 1.0 + self.per_token * min(depth, self.k)

    cost = CostCurve.linear(0.2)
    chain, none = TokenTree.from_chain([5] * 8), TokenTree.empty()
    lone = [Known(0.5, 8)] + [Known(0.0, 0)] * 3
    assert best_depth(lone, [chain, none, none, none], cost) == 0  # (4 + 0.5 d) / (1 + 0.2 d) < 4 for d > 0
    shared = [Known(0.5, 8)] * 4
    assert best_depth(shared, [chain] * 4, cost) == 8  # 4 (1 + 0.5 d) / (1 + 0.2 d) grows with d
    assert best_depth([Known(0.5, 8), TreeProposer()], [chain, none], cost) is None  # unknown: no cut
