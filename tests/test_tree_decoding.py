"""The tree decoding loop through ``generate(custom_generate=tree_generate)``: token-identical to plain greedy
``generate`` for random trees, same ``return_dict_in_generate`` outputs and cache, EOS / stopping criteria /
streamers, sliding-window fallback, sampling distribution end to end, clear errors."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, GenerationConfig, StoppingCriteria, StoppingCriteriaList

from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.tree import TokenTree
from hf_specdec.core.tree_decoding import TreeProposer, tree_generate
from hf_specdec.errors import SpecDecError

from .conftest import CollectStreamer, assert_pairs_follow_target, tiny_gpt2, tiny_llama
from .test_kv_cache import tiny_mistral

pytestmark = pytest.mark.usefixtures("one_thread")


class NoisyOracle(TreeProposer):
    """Random trees around the true continuation: a chain of the reference tokens (each corrupted with
    probability ``noise``) plus random nodes hung anywhere, so accepted paths end at random places."""

    needs_hidden_states = True

    def __init__(self, reference: torch.Tensor, seed: int, noise: float = 0.3, vocab: int = 97):
        self.ref, self.rng, self.noise, self.vocab = reference[0].tolist(), random.Random(seed), noise, vocab
        self.feedback = []

    def propose(self, input_ids, max_depth):
        L, rng = input_ids.shape[1], self.rng
        adds = [(rng.randint(-1, i - 1), rng.randrange(3, self.vocab)) for i in range(rng.randint(0, 8))]
        parent = -1
        for t in self.ref[L : L + rng.randint(0, 6)]:
            adds.append((parent, rng.randrange(3, self.vocab) if rng.random() < self.noise else t))
            parent = len(adds) - 1
        return TokenTree.from_additions(adds) if adds else TokenTree.empty()

    def observe(self, feedback):
        self.feedback.append(feedback)


def _greedy(model, prompt, n, **kw):
    return model.generate(prompt, max_new_tokens=n, do_sample=False, **kw)


@pytest.mark.parametrize("make,impl", [(tiny_llama, "sdpa"), (tiny_llama, "eager"), (tiny_gpt2, "sdpa")])
def test_greedy_tree_decoding_is_token_identical(make, impl):
    model = make()
    model.set_attn_implementation(impl)
    accepted = 0
    for seed in range(10):
        prompt = torch.randint(3, 97, (1, 4 + seed), generator=torch.Generator().manual_seed(seed))
        ref = _greedy(model, prompt, 24)
        stats = DecodeStats()
        proposer = NoisyOracle(ref, seed)
        out = _greedy(model, prompt, 24, custom_generate=tree_generate, proposer=proposer, stats=stats)
        assert torch.equal(out, ref), f"seed {seed}"
        new = out.shape[1] - prompt.shape[1]  # 24, or fewer if greedy decoding hit EOS (id 2)
        assert stats.target_forwards == len(stats.steps) and stats.new_tokens == new
        assert sum(s["new_tokens"] for s in stats.steps) == new
        accepted += stats.accepted
        fb = proposer.feedback[-1]  # the cache holds every token but the last, hidden states the kept ones
        assert fb.past_key_values.get_seq_length() == out.shape[1] - 1
        assert fb.hidden_states[0].shape[1] == len(fb.new_tokens)
    assert accepted > 30  # the trees were really used


def test_return_dict_matches_plain_generate():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, output_hidden_states=True)
    ref = _greedy(model, prompt, 16, **kw)
    out = _greedy(
        model, prompt, 16, custom_generate=tree_generate, proposer=NoisyOracle(ref.sequences, 1), **kw
    )
    assert torch.equal(out.sequences, ref.sequences)
    new = ref.sequences.shape[1] - prompt.shape[1]
    assert len(out.scores) == len(ref.scores) == len(out.logits) == len(out.hidden_states) == new > 4
    for a, b in zip(out.scores, ref.scores):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for step_a, step_b in zip(out.hidden_states, ref.hidden_states):
        for a, b in zip(step_a, step_b):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for a, b in zip(out.past_key_values.layers, ref.past_key_values.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4)


def test_attentions_match_plain_generate_with_eager():
    model = tiny_llama()
    model.set_attn_implementation("eager")
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(return_dict_in_generate=True, output_attentions=True)
    ref = _greedy(model, prompt, 12, **kw)
    out = _greedy(
        model, prompt, 12, custom_generate=tree_generate, proposer=NoisyOracle(ref.sequences, 1), **kw
    )
    assert torch.equal(out.sequences, ref.sequences) and len(out.attentions) == len(ref.attentions) > 3
    for step_a, step_b in zip(out.attentions, ref.attentions):  # per new token: (1, heads, q, kv) per layer
        for a, b in zip(step_a, step_b):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_eos_and_custom_stopping_criteria():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(7))
    free = _greedy(model, prompt, 30)[0, 5:].tolist()
    eos = free[9]  # a token greedy decoding emits mid-way: generation must stop right there
    ref = _greedy(model, prompt, 30, eos_token_id=eos)
    oracle = NoisyOracle(_greedy(model, prompt, 30), 0, noise=0.0)
    out = _greedy(model, prompt, 30, eos_token_id=eos, custom_generate=tree_generate, proposer=oracle)
    assert torch.equal(out, ref) and out[0, -1] == eos and out.shape[1] < 35

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([input_ids.shape[1] >= 5 + 7])

    crit = StoppingCriteriaList([StopAfter()])
    out = _greedy(model, prompt, 30, stopping_criteria=crit, custom_generate=tree_generate, proposer=oracle)
    assert out.shape[1] == 12 and out[0, 5:].tolist() == free[:7]


def test_streamer_receives_prompt_then_every_token():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 5))
    ref = _greedy(model, prompt, 12)
    s = CollectStreamer()
    out = _greedy(
        model, prompt, 12, custom_generate=tree_generate, proposer=NoisyOracle(ref, 0), specdec_streamer=s
    )
    assert s.follows(prompt, out)
    old = CollectStreamer()  # the old keyword still streams, with a warning that names the new one
    with pytest.warns(FutureWarning, match="specdec_streamer"):
        _greedy(
            model, prompt, 12, custom_generate=tree_generate, proposer=NoisyOracle(ref, 0), tree_streamer=old
        )
    assert old.chunks == s.chunks and old.ended


def test_direct_call_stops_at_max_length_and_eos():
    """Called without generate (no stopping criteria given), the loop stops at the config's max_length / EOS,
    as SPACE's always did (core/generate_io.py)."""
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    ref = _greedy(model, prompt, 12, eos_token_id=None)
    cfg = GenerationConfig(max_length=17, do_sample=False)
    with torch.no_grad():
        out = tree_generate(model, prompt, generation_config=cfg, proposer=NoisyOracle(ref, 0))
        assert torch.equal(out, ref)
        eos = int(ref[0, 9])
        cut = tree_generate(
            model,
            prompt,
            generation_config=GenerationConfig(max_length=17, eos_token_id=eos),
            proposer=NoisyOracle(ref, 0),
        )
    first = ref[0, 5:].tolist().index(eos) + 5
    assert torch.equal(cut, ref[:, : first + 1])


def test_sliding_window_model_keeps_its_trees_past_the_window():
    """The tree loop verifies a sliding-window model into a cache of full layers, the window applied in its masks
    (``core/sliding_window.py``): trees all the way, exact. A cache the caller passes with sliding-window entries
    already in it is kept: trees while they fit the window, then plain steps, exact too."""

    class Chain2(NoisyOracle):  # the next two reference tokens
        def propose(self, input_ids, max_depth):
            return TokenTree.from_chain(self.ref[input_ids.shape[1] : input_ids.shape[1] + 2])

    model = tiny_mistral(window=12)
    prompt = torch.randint(3, 97, (1, 3), generator=torch.Generator().manual_seed(0))
    ref = _greedy(model, prompt, 24)
    stats = DecodeStats()
    out = _greedy(model, prompt, 24, custom_generate=tree_generate, proposer=Chain2(ref, 0), stats=stats)
    assert torch.equal(out, ref)
    assert all(s["nodes"] for s in stats.steps[1:-1]) and stats.accepted > 12  # trees past the window too
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt[:, :-1], past_key_values=cache, use_cache=True)
    stats = DecodeStats()
    out = _greedy(
        model,
        prompt,
        24,
        custom_generate=tree_generate,
        proposer=Chain2(ref, 0),
        stats=stats,
        past_key_values=cache,
    )
    assert torch.equal(out, ref)
    assert any(s["nodes"] for s in stats.steps) and stats.steps[-1]["nodes"] == 0  # trees early, plain later


def test_errors_are_clear():
    model = tiny_llama()
    with pytest.raises(SpecDecError, match="empty prompt"):
        tree_generate(model, torch.randint(3, 97, (2, 0)), proposer=TreeProposer())
    with pytest.raises(SpecDecError, match="needs a proposer"):
        _greedy(model, torch.randint(3, 97, (1, 4)), 4, custom_generate=tree_generate)


def test_sampling_end_to_end_matches_target():
    """Tokens 2-3 sampled by a tiny peaked model (vocab 6, temperature + top-k) through sampled trees with q."""
    pytest.importorskip("scipy.stats")
    V = 6
    model = tiny_llama(vocab_size=V, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # a peaked target, so that a wrong rule shows
    prompt = torch.tensor([[1, 4, 2]])
    temp, top_k = 0.8, 4

    @torch.no_grad()
    def target(ids):
        logits = model(ids).logits[0, -1] / temp
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
        return torch.softmax(logits, -1)

    class Sampler(TreeProposer):  # samples children from a wrong "draft" distribution and reports q
        def propose(self, input_ids, max_depth):
            q = torch.full((V,), 1.0 / V)
            first = torch.multinomial(q, 2).tolist()
            q2 = q.clone()
            q2[first[0]] = 0
            q2 /= q2.sum()
            second = int(torch.multinomial(q, 1))
            return TokenTree.from_additions(
                [(-1, first[0]), (-1, first[1]), (0, second)], draft_probs=torch.stack([q, q2, q])
            )

    torch.manual_seed(0)  # the prefill samples token 1; trees are verified from token 2 on
    n, counts = 800, torch.zeros(V, V)
    for _ in range(n):
        out = model.generate(
            prompt,
            max_new_tokens=3,
            do_sample=True,
            temperature=temp,
            top_k=top_k,
            top_p=1.0,
            custom_generate=tree_generate,
            proposer=Sampler(),
        )
        counts[out[0, 4], out[0, 5]] += 1
    assert_pairs_follow_target(counts, prompt, target)


@pytest.mark.real
@pytest.mark.compat
def test_tree_lookup_is_lossless_on_the_real_target(real_target):
    from hf_specdec.bench.tree_methods import NGramTreeProposer

    model, tok = real_target
    text = "Rewrite with a list comprehension:\nsquares = []\nfor x in range(10):\n    squares.append(x * x)"
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    ref = _greedy(model, ids, 40, attention_mask=torch.ones_like(ids))
    stats = DecodeStats()
    out = _greedy(
        model,
        ids,
        40,
        attention_mask=torch.ones_like(ids),
        custom_generate=tree_generate,
        proposer=NGramTreeProposer(),
        stats=stats,
    )
    assert torch.equal(out, ref)
    assert stats.drafted > 0 and stats.target_forwards < 40
