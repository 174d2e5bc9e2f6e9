"""CAPE (GLIDE, arXiv:2402.02082, §4.2) on a GLIDE drafter: S(p) bins, siblings from the same draft forward (gamma forwards
per step), the tree is the CAPE mask, drafter cache sync, greedy token-identical, sampling keeps the target's
distribution, bench method, and the trained checkpoint on the real target."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hf_specdec
from hf_specdec.bench.methods import BenchContext, get_method
from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.tree_decoding import StepFeedback, tree_generate
from hf_specdec.errors import SpecDecError
from hf_specdec.glide.cape import CapeProposer, glide_cape
from hf_specdec.glide.expansion import (
    DEFAULT_EXPANSION,
    cape_tree,
    check_expansion,
    expansion_from,
    expansion_size,
    ranked_width,
)

from .conftest import CollectStreamer, assert_pairs_follow_target, tiny_llama
from .test_glide_model import _drafter

CHECKPOINT = Path(__file__).resolve().parent.parent / "hf_specdec" / "resources" / "glide-smollm2"  # shipped


pytestmark = pytest.mark.usefixtures("one_thread")


def _constructed(confidence: float, order: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax gives ``order[0]`` probability ``confidence`` and the rest strictly decreasing."""
    rest = 0.9 ** torch.arange(1, len(order), dtype=torch.float64)
    probs = torch.empty(len(order), dtype=torch.float64)
    probs[order[0]] = confidence
    probs[order[1:]] = (1 - confidence) * rest / rest.sum()
    return probs.log().float()


def _ready(proposer: CapeProposer, target, ids: torch.Tensor) -> None:
    """Put ``proposer`` where the tree core leaves it after the prefill of ``ids[:, :-1]``."""
    proposer.start(target, ids, target.generation_config)
    cache = target(ids[:, :-1], use_cache=True).past_key_values
    proposer.observe(StepFeedback(ids, [int(ids[0, -1])], 0, [], None, cache, is_prefill=True))


# ------------------------------------------------------------------ S(p) and the expansion sets
def expand(probs: torch.Tensor) -> tuple[int, float, list[int], list[float]]:
    """The proposal token, its confidence, the expansion set and its probabilities from one distribution: the
    reference the proposer's drafts are checked against."""
    top = probs.topk(min(ranked_width(DEFAULT_EXPANSION), probs.numel()))
    return expansion_from(top.values.tolist(), top.indices.tolist())


def test_expansion_sizes_follow_the_bins():
    sizes = [expansion_size(p) for p in (0.01, 0.3, 0.31, 0.6, 0.61, 0.8, 0.81, 1.0)]
    assert sizes == [7, 7, 5, 5, 3, 3, 1, 1]
    custom = check_expansion([(0.5, 2), (1.0, 0)])
    assert [expansion_size(p, custom) for p in (0.2, 0.5, 0.9)] == [2, 2, 0]
    for bad in ([], [(0.5, 2)], [(0.6, 2), (0.3, 1), (1.0, 0)], [(1.0, -1)]):
        with pytest.raises(SpecDecError, match="expansion table"):
            check_expansion(bad)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    for confidence, k in ((0.2, 7), (0.45, 5), (0.7, 3), (0.9, 1)):
        token, p, siblings, _ = expand(_constructed(confidence, order).softmax(-1))
        assert token == int(order[0]) and p == pytest.approx(confidence, abs=1e-5)
        assert siblings == order[1 : 1 + k].tolist()  # the next-best tokens, best first
    token, _, siblings, _ = expand(
        torch.tensor([0.3, 0.5, 0.2, 0.0, 0.0])
    )  # K = 5, no zero-probability sibling
    assert token == 1 and siblings == [0, 2]


def test_proposer_expansion_follows_constructed_draft_distributions():
    """Drive the drafter with constructed distributions (one per draft forward): the tree has the proposal chain
    and, at each depth, S(p_i) siblings of the proposal token, exactly the next-best tokens of that forward."""
    target = tiny_llama()
    d = _drafter(target)
    confidences = [0.2, 0.45, 0.7, 0.9, 0.25]
    gen = torch.Generator().manual_seed(1)
    orders = [3 + torch.randperm(94, generator=gen) for _ in confidences]  # never EOS (2)
    rows = [_constructed(c, torch.cat([o, torch.tensor([0, 1, 2])])) for c, o in zip(confidences, orders)]
    calls = []

    def constructed_logits(hidden):
        calls.append(hidden.shape)
        return rows[len(calls) - 1].expand(*hidden.shape[:-1], -1)

    d.draft_logits = constructed_logits
    proposer = CapeProposer(d, gamma=5)
    ids = torch.randint(3, 97, (1, 7), generator=gen)
    _ready(proposer, target, ids)
    tree = proposer.propose(ids, max_depth=10)
    assert len(calls) == 5  # gamma forwards, nothing more for the siblings
    assert proposer.last_sizes == [7, 5, 3, 1, 7]
    assert proposer.last_confidences == pytest.approx(confidences, abs=1e-5)
    chain = [int(o[0]) for o in orders]
    assert tree.tokens[:5].tolist() == chain and tree.parents[:5].tolist() == [-1, 0, 1, 2, 3]
    for i, (order, k) in enumerate(zip(orders, proposer.last_sizes)):
        kids = tree.children(i - 1)  # parent of depth i + 1: the proposal token before it (root for i = 0)
        assert kids[0] == i  # the proposal token is tried first
        assert tree.tokens[kids[1:]].tolist() == order[1 : 1 + k].tolist()
        assert all(not tree.children(c) for c in kids[1:])  # expansion tokens are leaves
    assert len(tree) == 5 + 7 + 5 + 3 + 1 + 7
    calls.clear()
    assert proposer.propose(ids, max_depth=2).max_depth == 2 and len(calls) == 2  # max_depth caps gamma


# ------------------------------------------------------------------ the tree is the CAPE mask
def test_tree_mask_is_the_cape_mask():
    proposal = [11, 12, 13, 14]
    expansions = [[21, 22, 23], [], [31, 32, 33, 34, 35], [41]]
    tree = cape_tree(proposal, expansions)
    gamma = len(proposal)
    pos = list(range(gamma)) + [i for i, e in enumerate(expansions) for _ in e]  # pos() of §4.2, 0-based
    beta = len(pos)
    assert tree.tokens.tolist() == proposal + [t for e in expansions for t in e]  # the paper's linearization
    paper = torch.tensor([[(j < gamma and pos[i] > j) or i == j for j in range(beta)] for i in range(beta)])
    mask = tree.ancestor_mask()
    assert mask[:, 0].all()  # every fed token sees the root (the last committed token)
    assert torch.equal(mask[1:, 1:], paper)
    # same position id for an expansion token and the proposal token it stands in for
    assert tree.position_ids(10)[0, 1:].tolist() == [11 + p for p in pos]
    full = tree.attention_mask(10)
    assert full.shape == (1, 1, beta + 1, 10 + beta + 1) and full[0, 0, :, :10].all()


# ------------------------------------------------------------------ gamma forwards per step, drafter cache sync
class Recording(CapeProposer):
    """Records per step: drafter forwards, the tree, max_depth, the draft logits rows of the step's forwards and
    how many tokens its first forward fed (``rows`` / ``fed_lengths`` are filled by spies on the drafter)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.steps, self.accepted_expansions, self.rows, self.fed_lengths = [], 0, [], []

    def propose(self, input_ids, max_depth):
        before, first = self.state.forwards, len(self.fed_lengths)
        self.rows = []
        tree = super().propose(input_ids, max_depth)
        fed, n = self.state.fed, input_ids.shape[1]
        if len(tree):  # the drafter cache holds the committed tokens, then the proposal tokens but the last
            assert fed[:n].tolist() == input_ids[0].tolist()
            assert fed[n:].tolist() == tree.tokens[: tree.max_depth - 1].tolist()
            assert self.state.cache.get_seq_length() == len(fed)
        catch_up = self.fed_lengths[first] if len(self.fed_lengths) > first else 0
        self.steps.append((self.state.forwards - before, tree, max_depth, list(self.rows), catch_up))
        return tree

    def observe(self, feedback):
        super().observe(feedback)
        if feedback.tree is not None:
            self.accepted_expansions += sum(
                node >= feedback.tree.max_depth for node in feedback.accepted_nodes
            )


def test_siblings_come_from_the_same_forward_gamma_forwards_per_step():
    target = tiny_llama()
    d = _drafter(target)
    proposer = Recording(d, gamma=4)
    original = d.draft_logits

    def spy(hidden):
        out = original(hidden)
        proposer.rows.append(out[0, -1].float())
        return out

    def spy_hidden(ids, positions, cache, **kwargs):
        proposer.fed_lengths.append(ids.shape[1])
        return type(d).hidden_states(d, ids, positions, cache, **kwargs)

    d.draft_logits, d.hidden_states = spy, spy_hidden
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(2))
    ref = target.generate(prompt, max_new_tokens=30, do_sample=False)
    out = target.generate(
        prompt, max_new_tokens=30, do_sample=False, custom_generate=tree_generate, proposer=proposer
    )
    assert torch.equal(out, ref)
    full_steps = 0
    for forwards, tree, max_depth, rows, _ in proposer.steps:
        depth = tree.max_depth
        assert forwards == len(rows) == depth  # one forward per proposal token; the siblings cost nothing
        ended_by_eos = depth and int(tree.tokens[depth - 1]) == 2
        assert depth == min(4, max_depth) or ended_by_eos
        full_steps += depth == 4
        for i, row in enumerate(rows):  # position i's siblings are the runners-up of forward i
            token, _, siblings, _ = expand(row.softmax(-1))
            assert int(tree.tokens[i]) == token
            assert tree.tokens[[c for c in tree.children(i - 1) if c != i]].tolist() == siblings
    assert full_steps >= 3
    # the first step feeds the prompt and the first token (cross-attending to the prefill's cache); later steps
    # only catch up the accepted expansion token or the last proposal token, and the new root
    catch_up = [step[4] for step in proposer.steps if step[0]]
    assert catch_up[0] == prompt.shape[1] + 1 and all(1 <= c <= 2 for c in catch_up[1:])


# ------------------------------------------------------------------ lossless
@pytest.mark.parametrize("kw", [{}, {"cross_attention": False}, {"draft_vocab_size": 50}])
def test_greedy_is_token_identical_to_plain_generate(kw):
    target = tiny_llama()
    d = _drafter(target, **kw)
    if kw.get("draft_vocab_size"):
        d.set_draft_vocab(torch.arange(47, 97))
    for seed in range(2):
        prompt = torch.randint(3, 97, (1, 5 + seed), generator=torch.Generator().manual_seed(seed))
        ref = target.generate(prompt, max_new_tokens=24, do_sample=False)
        stats = DecodeStats()
        out = target.generate(
            prompt,
            max_new_tokens=24,
            do_sample=False,
            custom_generate=hf_specdec.glide_cape,
            drafter=d,
            cape_cost=False,  # the paper's full S(p): expansion must happen (the cost trim is tested apart)
            stats=stats,
        )
        assert torch.equal(out, ref), (kw, seed)
        assert stats.new_tokens == out.shape[1] - prompt.shape[1]
        assert stats.target_forwards == len(stats.steps) and stats.tau == pytest.approx(
            stats.new_tokens / stats.target_forwards
        )
        assert max(s["nodes"] for s in stats.steps) > max(s["depth"] for s in stats.steps)  # expanded


def test_streamer_keyword_and_its_deprecated_name():
    target = tiny_llama()
    d = _drafter(target)
    prompt = torch.randint(3, 97, (1, 5), generator=torch.Generator().manual_seed(0))
    kw = dict(
        max_new_tokens=12, do_sample=False, custom_generate=hf_specdec.glide_cape, drafter=d, cape_cost=False
    )
    new, old = CollectStreamer(), CollectStreamer()
    out = target.generate(prompt, specdec_streamer=new, **kw)
    assert new.follows(prompt, out)
    with pytest.warns(FutureWarning, match="specdec_streamer"):
        target.generate(prompt, tree_streamer=old, **kw)
    assert old.chunks == new.chunks


def test_accepted_expansion_tokens_happen_and_stay_exact():
    """With a weak drafter some accepted tokens are expansion tokens (not the proposal's); the output stays exact
    and the drafter cache is re-synced after them (checked in ``Recording.propose``)."""
    target = tiny_llama()
    d = _drafter(target, seed=5)
    proposer = Recording(d, gamma=3)
    for seed in range(3):
        prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(10 + seed))
        ref = target.generate(prompt, max_new_tokens=24, do_sample=False)
        out = target.generate(
            prompt, max_new_tokens=24, do_sample=False, custom_generate=tree_generate, proposer=proposer
        )
        assert torch.equal(out, ref)
    assert proposer.accepted_expansions > 0


def test_sampling_keeps_the_target_distribution():
    """Tokens 2-3 (the first tree step, gamma 2) sampled by a tiny peaked target (vocab 6, temperature + top-k) through CAPE trees (deterministic
    drafts, one-hot q): chi-square of their joint against the target's."""
    pytest.importorskip("scipy.stats")
    V = 6
    target = tiny_llama(vocab_size=V, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)  # a peaked target, so that a wrong rule shows
    d = _drafter(target, seed=4)
    prompt = torch.tensor([[1, 4, 2]])
    temp, top_k = 0.8, 4

    @torch.no_grad()
    def p(ids):
        logits = target(ids).logits[0, -1] / temp
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
        return torch.softmax(logits, -1)

    torch.manual_seed(0)
    n, counts, nodes = 500, torch.zeros(V, V), 0
    for _ in range(n):
        st = DecodeStats()
        out = target.generate(
            prompt,
            max_new_tokens=4,
            do_sample=True,
            temperature=temp,
            top_k=top_k,
            top_p=1.0,
            custom_generate=glide_cape,
            drafter=d,
            cape_gamma=2,
            cape_cost=False,  # the full S(p), whatever the machine's load: trees with siblings are what is tested
            stats=st,
        )
        counts[out[0, 4], out[0, 5]] += 1
        nodes = max(nodes, st.steps[1]["nodes"])
    assert nodes > 2  # depth-2 trees with siblings
    assert_pairs_follow_target(counts, prompt, p)


def test_clear_errors():
    target = tiny_llama()
    with pytest.raises(SpecDecError, match="needs a GLIDE drafter"):
        target.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=3, custom_generate=glide_cape)
    with pytest.raises(SpecDecError, match="GLIDE drafter"):
        CapeProposer(tiny_llama())
    assert DEFAULT_EXPANSION == ((0.3, 7), (0.6, 5), (0.8, 3), (1.0, 1))


# ------------------------------------------------------------------ bench method
def test_bench_method_glide_cape(tmp_path):
    target = tiny_llama()
    _drafter(target).save_pretrained(tmp_path)
    method = get_method("glide-cape")()
    method.setup(
        BenchContext(
            target,
            None,
            "fp32",
            {"glide": str(tmp_path), "gamma": "3", "cape_bins": "0.5:2,1:1", "cape_cost": "0"},
        )
    )
    assert method.drafter.generation_config.num_assistant_tokens == 3
    prompt = torch.randint(3, 97, (1, 6), generator=torch.Generator().manual_seed(0))
    tokens, stats = method.generate(prompt, 16)
    assert torch.equal(tokens, target.generate(prompt, max_new_tokens=16, do_sample=False)[0, 6:])
    assert stats.new_tokens == len(tokens) and stats.target_forwards == len(stats.steps)
    assert max(s["nodes"] for s in stats.steps) <= 3 * 3 and max(s["depth"] for s in stats.steps) == 3
    with pytest.raises(SpecDecError, match="cape_bins"):
        method.setup(BenchContext(target, None, "fp32", {"glide": str(tmp_path), "cape_bins": "0.5-2"}))


def test_an_option_no_method_reads_is_an_error(tmp_path):
    """``--option drafter=PATH`` (GLIDE's key is ``glide``) once ran the shipped drafter without a word: the bench now
    fails, naming the unread key, once the methods are set up and before anything is timed."""
    from hf_specdec.bench.method_options import check_read, option_strings

    target = tiny_llama()
    _drafter(target).save_pretrained(tmp_path)
    options = option_strings({"glide": str(tmp_path), "gamma": "3", "drafter": "/elsewhere"})
    get_method("glide-cape")().setup(BenchContext(target, None, "fp32", options))
    with pytest.raises(SpecDecError, match="--option drafter: no method of ar, glide-cape reads it"):
        check_read(options, ["ar", "glide-cape"])
    del options["drafter"]
    check_read(options, ["ar", "glide-cape"])


# ------------------------------------------------------------------ the trained drafter on the real target
@pytest.mark.real
@pytest.mark.compat
def test_real_target_trained_glide_cape_is_identical(real_target):
    """The GLIDE checkpoint shipped in the package loads through AutoModelForCausalLM for the default target;
    its chain (assistant_model) and CAPE outputs equal plain greedy decoding, and CAPE accepts drafts."""
    from hf_specdec.modeling import GlideForCausalLM
    from transformers import AutoModelForCausalLM

    model, tok = real_target
    d = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=model.dtype).eval()
    assert isinstance(d, GlideForCausalLM) and d.config.draft_vocab_size == 8192
    d.attach_target(model)
    accepted = 0
    for text in ("Write a Python function that reverses a string.", "What is the capital of France?"):
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        mask = torch.ones_like(ids)
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False)
        chain = model.generate(
            ids, attention_mask=mask, max_new_tokens=32, do_sample=False, assistant_model=d
        )
        assert torch.equal(chain, ref), text
        for cost in (True, False):  # the cost rule (may draft nothing on a slow CPU), the paper's tree
            stats = DecodeStats()
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=32,
                do_sample=False,
                custom_generate=hf_specdec.glide_cape,
                drafter=d,
                cape_cost=cost,
                stats=stats,
            )
            assert torch.equal(out, ref), (text, cost)
        accepted += stats.accepted
    assert accepted > 0


def test_draft_budget_keeps_the_cape_tokens_that_pay_for_their_verification():
    from hf_specdec.core.draft_budget import DraftBudget
    from hf_specdec.core.verify_cost import CostCurve
    from hf_specdec.glide.expansion import node_estimates

    confidences = [0.5, 0.9, 0.2]
    sibling_probs = [[0.3, 0.1], [0.05], [0.4, 0.3, 0.01]]
    # node order: proposal 0.5, 0.45, 0.09 | X_1 0.3, 0.1 | X_2 0.025 | X_3 0.18, 0.135, 0.0045
    estimates = node_estimates(confidences, sibling_probs)
    assert estimates == pytest.approx([0.5, 0.45, 0.09, 0.3, 0.1, 0.025, 0.18, 0.135, 0.0045])
    depths = cape_tree([1, 2, 3], [[4, 5], [6], [7, 8, 9]]).depths
    assert DraftBudget(CostCurve.linear(0.0)).keep(estimates, depths) == list(
        range(9)
    )  # free: the whole tree
    # linear 0.12, free drafter: a node is kept while e >= 0.12 * E / T; after 0.5, 0.45, 0.3, E / T = 2.25 / 1.36,
    # so 0.18 needs 0.199 and the tree stops
    assert DraftBudget(CostCurve.linear(0.12)).keep(estimates, depths) == [0, 1, 3]
    assert DraftBudget(CostCurve.linear(0.6)).keep(estimates, depths) == []  # too dear: no draft at all
    # in a batch of 2 rows a node's marginal cost counts twice
    assert DraftBudget(CostCurve.linear(0.06), rows=2).keep(estimates, depths) == [0, 1, 3]
    # the drafter forwards already spent (3 x 0.5) lower E / T, hence the bar: 0.18, 0.135 and 0.1 pay too
    assert DraftBudget(CostCurve.linear(0.12), 0.5).keep(estimates, depths, forwards=3) == [0, 1, 3, 4, 6, 7]
    # a kept set is a tree: a node's parent is always kept before it (estimates never grow down a path)
    tree = cape_tree([1, 2, 3], [[4, 5], [6], [7, 8, 9]])
    for slope in (0.01, 0.05, 0.1, 0.2, 0.3):
        kept = set(DraftBudget(CostCurve.linear(slope)).keep(estimates, depths))
        assert all(tree.parent_list[i] in kept | {-1} for i in kept)


def test_draft_budget_runs_a_drafter_forward_only_when_it_can_pay():
    from hf_specdec.core.draft_budget import DraftBudget
    from hf_specdec.core.verify_cost import CostCurve

    budget = DraftBudget(CostCurve.linear(0.1), drafter_cost=0.05)
    assert budget.worth_drafting(0.16, n=1)  # 0.16 >= 0.05 + 0.1
    assert not budget.worth_drafting(0.14, n=1)
    assert DraftBudget(CostCurve.linear(0.0), 0.0).worth_drafting(1e-9, n=30)  # free: always deeper


@pytest.mark.parametrize("kw", [{}, {"draft_vocab_size": 50}])
def test_one_host_read_per_step_with_a_budget_or_without_and_the_same_tree(kw):
    """The proposal is fed back on the device and the step reads the device once, without a budget (the paper's
    CAPE) and with one (drafted to the depth the last step asked for, then cut); when the budget never cuts (a free
    verification and drafter) both give the same tree, and the next sized draft stays at gamma."""
    from hf_specdec.core.draft_budget import DraftBudget
    from hf_specdec.core.host_syncs import HostSyncCounter
    from hf_specdec.core.verify_cost import CostCurve

    target = tiny_llama()
    d = _drafter(target, **kw)
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        ids = torch.randint(3, 97, (1, 9), generator=gen)
        unread, sized = (
            CapeProposer(d, gamma=5),
            CapeProposer(d, gamma=5, budget=DraftBudget(CostCurve.linear(0))),
        )
        _ready(unread, target, ids)
        _ready(sized, target, ids)
        with HostSyncCounter() as syncs:
            tree = unread.propose(ids, max_depth=10)
        with HostSyncCounter() as sized_syncs:
            reference = sized.propose(ids, max_depth=10)
        assert syncs.total == 1, syncs.by_kind
        assert sized_syncs.total == 1, sized_syncs.by_kind
        assert sized.depth == 5
        assert tree.tokens.tolist() == reference.tokens.tolist() and len(tree) > 5
        assert tree.parents.tolist() == reference.parents.tolist()
        assert unread.last_confidences == pytest.approx(sized.last_confidences)
        assert unread.last_sizes == sized.last_sizes
