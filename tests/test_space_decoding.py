"""SPACE auto-correct decoding (SPACE, arXiv:2402.11809, §3.2, Alg. 1, eq. 4-7, Fig. 7)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import MaxLengthCriteria, TemperatureLogitsWarper, TopKLogitsWarper

import hf_specdec
from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.errors import SpecDecError
from hf_specdec.space.decoding import space_generate, space_tree

from .conftest import CollectStreamer, tiny_gpt2, tiny_llama

# Fig. 7 (k = 2): LLMs are [M] [M] auto [M] [M] model [M] [M]
FIG7 = """
1 0 0 0 0 0 0 0 0 0
1 1 0 0 0 0 0 0 0 0
1 1 1 0 0 0 0 0 0 0
1 1 1 1 0 0 0 0 0 0
1 1 0 0 1 0 0 0 0 0
1 1 0 0 1 1 0 0 0 0
1 1 0 0 1 1 1 0 0 0
1 1 0 0 1 0 0 1 0 0
1 1 0 0 1 0 0 1 1 0
1 1 0 0 1 0 0 1 1 1
"""


def _fig7_tree():
    """Fig. 7's input after "LLMs" (cached): root "are", then [M] [M] auto [M] [M] model [M] [M]."""
    return space_tree([103, 104], k=2, mask_token_id=0)


def test_tree_is_eq4_and_its_mask_is_fig7():
    tree = _fig7_tree()
    assert tree.token_list == [0, 0, 103, 0, 0, 104, 0, 0]  # eq. 4 after the root
    expected = torch.tensor([[int(v) for v in line.split()] for line in FIG7.strip().splitlines()]).bool()
    assert torch.equal(
        tree.attention_mask(1)[0, 0], expected[1:, :]
    )  # rows from the root; "LLMs" is the prefix


def test_positions_are_row_sums_minus_one():
    expected = torch.tensor([[int(v) for v in line.split()] for line in FIG7.strip().splitlines()]).bool()
    assert (expected.long().sum(-1) - 1).tolist() == [0, 1, 2, 3, 2, 3, 4, 3, 4, 5]
    assert _fig7_tree().position_ids(7)[0].tolist() == [7, 8, 9, 8, 9, 10, 9, 10, 11]  # root at 7, as "are"


def test_mask_groups_do_not_see_each_other_for_large_k():
    k = 5
    tree = space_tree([50 + i for i in range(k)], k=k, mask_token_id=0)
    assert len(tree) == k + (k + 1) * k  # the candidates and a group after each real token
    a = tree.ancestor_mask()  # fed index 0 = the root
    is_mask = torch.tensor([False] + [t == 0 for t in tree.token_list])
    for g in range(k + 1):
        start = 1 + g * (k + 1)
        rows = a[start : start + k]
        assert torch.equal(
            rows[:, start : start + k], torch.ones(k, k).tril().bool()
        )  # causal inside the group
        others = [j for j in range(len(is_mask)) if is_mask[j] and not start <= j < start + k]
        assert not rows[:, others].any()  # no mask of another group
        reals = [0] + [i * (k + 1) for i in range(1, g + 1)]
        assert rows[:, reals].all()  # the root and the earlier candidates
    reals = ~is_mask
    assert not a[reals][:, is_mask].any()  # real tokens never see masks
    assert torch.equal(a[reals][:, reals], torch.ones(int(reals.sum()), int(reals.sum())).tril().bool())


def _peaked(model, tokens=(3, 4, 5), mask_id=None, k=3):
    """A random model whose argmax is always one of ``tokens`` (context-dependent), so SPACE candidates are
    accepted often enough to exercise partial acceptance and KV compaction."""
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        head.mul_(0.01)
        head[list(tokens)] = (
            torch.randn(len(tokens), head.shape[1], generator=torch.Generator().manual_seed(1)) * 3
        )
    model.config.space_k = k
    model.config.space_mask_token_id = model.config.vocab_size - 1 if mask_id is None else mask_id
    return model


@pytest.mark.parametrize("make", [tiny_llama, tiny_gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("k,num_masks", [(3, None), (1, None), (4, 2)])
def test_greedy_is_token_identical(make, k, num_masks):
    model = _peaked(make(vocab_size=97), k=k)
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    ref = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    stats = DecodeStats()
    out = model.generate(
        prompt,
        max_new_tokens=30,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        custom_generate=hf_specdec.space,
        num_masks=num_masks,
        stats=stats,
        space_cost=False,  # every candidate (the measured cost rule may verify none on a slow CPU: test_cost_*)
    )
    assert torch.equal(out, ref)
    assert (
        stats.new_tokens == 30 and stats.target_forwards < 30 and stats.accepted > 0
    )  # steps with > 1 token
    assert stats.accepted == stats.new_tokens - stats.target_forwards


def test_cache_holds_only_real_tokens():
    model = _peaked(tiny_llama(vocab_size=97))
    prompt = torch.tensor([[1, 5, 7, 9]])
    out = model.generate(
        prompt,
        max_new_tokens=17,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        custom_generate=space_generate,
        return_dict_in_generate=True,
        output_scores=True,
    )
    seq = out.sequences
    assert len(out.scores) == 17
    cache = out.past_key_values
    assert cache.get_seq_length() == seq.shape[1] - 1  # the last token is pending, nothing else
    plain = model(seq[:, :-1], use_cache=True).past_key_values
    for a, b in zip(cache.layers, plain.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4)


def test_streamer_gets_the_prompt_then_every_token():
    model = _peaked(tiny_llama(vocab_size=97))
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    streamer = CollectStreamer()
    kw = dict(eos_token_id=None, pad_token_id=0, custom_generate=hf_specdec.space, specdec_streamer=streamer)
    out = model.generate(prompt, max_new_tokens=20, do_sample=False, **kw)
    assert streamer.follows(prompt, out)


def test_stops_at_eos_inside_an_accepted_run():
    model = _peaked(tiny_llama(vocab_size=97))
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    ref = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    eos = int(ref[0, prompt.shape[1] + 5])  # a token that first appears within the output
    ref_eos = model.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out = model.generate(
        prompt,
        max_new_tokens=30,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        custom_generate=hf_specdec.space,
    )
    assert torch.equal(out, ref_eos) and int(out[0, -1]) == eos


@pytest.mark.parametrize("space_cost", [False, CostCurve.linear(0.158)], ids=["all", "cost-sized"])
def test_sampling_keeps_the_target_distribution(space_cost):
    """Sampled tokens 2 and 3 (temperature + top-k) through SPACE: the prefill emits token 1, the next step feeds the
    first mask group and emits token 2, and token 3 goes through the min(1, Q/P_c) test against a candidate drawn
    from that group's mask distribution, with residual resampling. Cost-sized:
    the first candidate is verified only when its mask distribution is confident enough (max prob >= 0.36: about
    half the steps with this model; its confidences lie in 0.35-0.38)."""
    stats = pytest.importorskip("scipy.stats")
    V = 7
    model = tiny_llama(vocab_size=V, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model.config.space_k, model.config.space_mask_token_id = 2, V - 1
    prompt = torch.tensor([[1, 4, 2]])
    temp, top_k = 0.8, 3

    def target(ids):
        logits = model(ids).logits[0, -1] / temp
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
        return torch.softmax(logits, -1)

    # space_generate is called directly (what generate would pass it) to keep 500 runs cheap on a busy CPU.
    procs = LogitsProcessorList([TemperatureLogitsWarper(temp), TopKLogitsWarper(top_k)])
    cfg = GenerationConfig(
        do_sample=True, max_length=prompt.shape[1] + 4
    )  # room for the step drafting token 3
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    n, counts, st = 500, torch.zeros(V, V), DecodeStats()
    try:
        with torch.no_grad():
            for _ in range(n):
                out = space_generate(model, prompt, procs, stop, cfg, stats=st, space_cost=space_cost)
                counts[out[0, 4], out[0, 5]] += 1
    finally:
        torch.set_num_threads(threads)
    assert 0 < st.accepted < st.drafted  # both branches (accept / residual) were taken
    with torch.no_grad():
        p1, expected = target(prompt), torch.zeros(V, V)  # (token 2, token 3), token 1 summed out
        for a in p1.nonzero()[:, 0].tolist():
            first = torch.cat([prompt, torch.tensor([[a]])], 1)
            p2 = target(first)
            for b in p2.nonzero()[:, 0].tolist():
                expected[b] += p1[a] * p2[b] * target(torch.cat([first, torch.tensor([[b]])], 1))
    keep = expected.flatten() > 0
    assert counts.flatten()[~keep].sum() == 0
    exp = expected.flatten()[keep].double()
    assert (
        stats.chisquare(counts.flatten()[keep].double().numpy(), (exp * n / exp.sum()).numpy()).pvalue > 1e-3
    )


def test_errors_are_clear():
    model = tiny_llama(vocab_size=97)
    with pytest.raises(SpecDecError, match="not trained for SPACE"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, custom_generate=hf_specdec.space)


@pytest.mark.parametrize("space_cost", [False, CostCurve({1: 1.0, 2: 1.0})], ids=["all", "cost-sized"])
def test_a_left_padded_batch_decodes_every_row_as_alone(space_cost):
    """Every row of a batch drafts, is verified in the same forward and accepts on its own: each row's greedy output
    is the row's plain greedy output."""
    model = _peaked(tiny_llama(vocab_size=97), k=2)
    prompts = [[1, 5, 7, 9, 11, 4], [2, 8], [3, 3, 6, 1]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    stats = DecodeStats()
    out = model.generate(ids, attention_mask=mask, custom_generate=hf_specdec.space, space_cost=space_cost,
                         stats=stats, **kw)  # fmt: skip
    for row, prompt in enumerate(prompts):
        ref = model.generate(torch.tensor([prompt]), **kw)[0, len(prompt) :]
        assert torch.equal(out[row, width:], ref), row
    assert stats.batched_forwards < 20 and stats.accepted > 0


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.compat
def test_greedy_is_token_identical_on_the_real_target(real_target):
    """The layout on SmolLM2 with a fresh (untrained) mask row: candidates are mostly wrong, output exact."""
    import copy

    from hf_specdec.trainers.space.train import add_mask_token

    from hf_specdec.tasks import load_task

    model, tok = real_target
    model, tok = copy.deepcopy(model), copy.deepcopy(tok)
    add_mask_token(model, tok, k=3)
    ids = tok(load_task("code-edit", tok, 1)[0]["prompt"], return_tensors="pt").input_ids
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=24,
        do_sample=False,
        custom_generate=hf_specdec.space,
    )
    assert torch.equal(out, ref)


def test_cost_sized_candidates_stay_exact_and_shrink_with_the_cost():
    """Issue #31: where verifying a token costs three forwards, fewer candidates are verified than where it is
    free; greedy output identical to plain decoding either way."""
    model = _peaked(tiny_llama(vocab_size=97), k=3)
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = model.generate(prompt, **kw)
    drafted = {}
    for name, cost in (
        ("free", CostCurve({1: 1.0, 2: 1.0})),
        ("steep", CostCurve.linear(3.0)),
        ("off", False),
    ):
        stats = DecodeStats()
        out = model.generate(prompt, custom_generate=hf_specdec.space, space_cost=cost, stats=stats, **kw)
        assert torch.equal(out, ref), name
        drafted[name] = stats.drafted / stats.target_forwards
    assert drafted["free"] == drafted["off"] > drafted["steep"], drafted


def test_card_tau_feeds_every_mask(monkeypatch):
    """The card's tau (``trainers/space/card.measure_tau``) is the paper's decoding, every mask every step, as its
    detail line says: not gated by this machine's cost curve, which can switch the masks off and report tau 1."""
    from types import SimpleNamespace

    from hf_specdec.trainers.space.card import measure_tau

    import hf_specdec.tasks

    model = _peaked(tiny_llama(vocab_size=97), k=3)
    prompt = torch.tensor([[1, 5, 7, 9, 11, 4]])
    monkeypatch.setattr(hf_specdec.tasks, "load_task", lambda task, tok, n: [{"prompt": "p"}] * n)
    tokenizer = lambda text, return_tensors: SimpleNamespace(input_ids=prompt)  # noqa: E731
    calls, generate = [], model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **kw: calls.append(kw) or generate(*a, **kw))

    tau, detail = measure_tau(model, tokenizer, n_prompts=2, max_new_tokens=24)

    assert [(kw["space_cost"], kw["num_masks"]) for kw in calls] == [(False, 3)] * 2
    stats = DecodeStats()
    generate(prompt, max_new_tokens=24, do_sample=False, custom_generate=space_generate, num_masks=3,
             space_cost=False, stats=stats)  # fmt: skip
    assert tau == pytest.approx(stats.new_tokens / stats.target_forwards) and tau > 1.2
    assert "all 3 masks" in detail
