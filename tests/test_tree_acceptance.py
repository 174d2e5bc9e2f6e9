"""Tree acceptance rules: greedy longest match, and tree speculative sampling reproduces the target distribution.

The sampling tests use a synthetic target over a 5-token vocabulary (no model): ``T[x]`` are the logits of
the next token after token ``x``, ``root_logits`` those after the committed prefix. The tree's logits rows
are then ``T[node token]``, exactly what a target would give. Chi-square on the joint of the first two
emitted tokens against ``p0(x1) * p(x2 | x1)``; a deliberately broken residual update must fail it. Both
walks are tested: one host read per level, and one per step (``one_read``, which runs every level on the device).
The greedy tests with a repetition penalty check the level walk against a plain node-by-node walk and plain
``generate``, and count the host reads.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import hf_specdec.core.acceptance as acceptance
from hf_specdec.core.acceptance import accept_tree, processed_scores, sample_children
from hf_specdec.core.host_syncs import HostSyncCounter
from hf_specdec.core.proposer import TreeProposer
from hf_specdec.core.stats import ForwardMeter
from hf_specdec.core.tree import ROOT, TokenTree
from hf_specdec.core.tree_decoding import tree_generate

from .conftest import tiny_llama

stats = pytest.importorskip("scipy.stats")


pytestmark = pytest.mark.usefixtures("one_thread")


V = 5
GEN = torch.Generator().manual_seed(0)
ROOT_LOGITS = torch.randn(V, generator=GEN) * 1.5
T = torch.randn(V, V, generator=GEN) * 1.5  # T[x] = next-token logits after token x
IDS = torch.tensor([[0, 1]])


def test_greedy_takes_longest_matching_path():
    #   root ─┬─ 3(0) ── 1(2)
    #         └─ 4(1) ── 2(3) ── 0(4)
    tree = TokenTree.from_additions([(-1, 3), (-1, 4), (0, 1), (1, 2), (3, 0)])
    logits = torch.full((6, V), -5.0)
    logits[0, 4] = 5  # root -> 4 (node 1)
    logits[2, 2] = 5  # node 1 -> 2 (node 3)
    logits[4, 3] = 5  # node 3 -> 3: no such child, bonus 3
    logits[1, 1] = 5  # node 0's row (not on the path) must not matter
    acc = accept_tree(tree, logits, IDS)
    assert acc.nodes == [1, 3] and acc.tokens == [4, 2, 3] and len(acc.scores) == 3


def test_greedy_with_no_match_emits_target_token():
    acc = accept_tree(TokenTree.from_chain([2, 3]), torch.eye(V)[[4, 0, 0]] * 3, IDS)
    assert acc.nodes == [] and acc.tokens == [4]


def test_greedy_uses_processors_with_path_ids():
    """A processor that depends on the ids (repetition penalty style) sees the accepted path."""

    class BanLast:
        def __call__(self, ids, scores):
            scores = scores.clone()
            scores[0, ids[0, -1]] = -1e9
            return scores

    tree = TokenTree.from_chain([3, 3])
    logits = torch.zeros(3, V)
    logits[:, 3] = 5.0
    acc = accept_tree(tree, logits, IDS, LogitsProcessorList([BanLast()]))
    assert acc.tokens[0] == 3 and acc.nodes == [0] and acc.tokens[1] != 3


def _processors(kind: str) -> LogitsProcessorList:
    return {
        "plain": LogitsProcessorList(),
        "temp": LogitsProcessorList([TemperatureLogitsWarper(0.7)]),
        "topk": LogitsProcessorList([TopKLogitsWarper(3)]),
        "topp": LogitsProcessorList([TemperatureLogitsWarper(1.3), TopPLogitsWarper(0.8)]),
    }[kind]


def _target(lp, ids, logits):
    return torch.softmax(lp(ids, logits[None].clone())[0], -1)


def _draft_tree(mode: str) -> TokenTree:
    """Depth-2 tree with 2 children under the root and 2 under each child, drafted in ``mode``."""
    q_root = torch.softmax(torch.tensor([0.5, -0.2, 1.0, 0.0, 0.3]), -1)
    if mode == "deterministic":  # e.g. n-gram lookup or a drafter's top-k: q = one-hot
        kids = [2, 4]
        adds = [(-1, t) for t in kids] + [
            (i, t) for i, k in enumerate(kids) for t in ((k + 1) % V, (k + 3) % V)
        ]
        return TokenTree.from_additions(adds)
    adds, rows = [], []
    if mode == "iid":  # i.i.d. samples (duplicates possible), q = the draft distribution for each
        kids = torch.multinomial(q_root, 2, replacement=True).tolist()
        q_kids = q_root.expand(2, V)
    else:  # "without-replacement" (EAGLE-2 style): q of the 2nd child excludes the 1st
        kids, q_kids = sample_children(q_root, 2)
    adds += [(-1, t) for t in kids]
    rows += list(q_kids)
    for i, k in enumerate(kids):
        q = torch.softmax(-T[k], -1)  # a deliberately poor drafter
        toks, qs = sample_children(q, 2)
        adds += [(i, t) for t in toks]
        rows += list(qs)
    return TokenTree.from_additions(adds, draft_probs=torch.stack(rows))


def _joint_counts(
    mode: str, kind: str, n: int, one_read: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    lp = _processors(kind)
    counts = torch.zeros(V, V)
    for _ in range(n):
        tree = _draft_tree(mode)
        logits = torch.cat([ROOT_LOGITS[None], T[tree.tokens]])
        acc = accept_tree(tree, logits, IDS, lp, do_sample=True, one_read=one_read)
        x1 = acc.tokens[0]
        if len(acc.tokens) > 1:
            x2 = acc.tokens[1]
        else:  # the step ended at x1: the next step would sample from the target after x1
            x2 = int(torch.multinomial(_target(lp, IDS, T[x1]), 1))
        counts[x1, x2] += 1
    p1 = _target(lp, IDS, ROOT_LOGITS)
    expected = torch.stack([p1[a] * _target(lp, IDS, T[a]) for a in range(V)]) * n
    return counts, expected


def _chi2_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected.flatten() > 0
    assert counts.flatten()[~keep].sum() == 0, "sampled a token the target gives probability 0"
    obs, exp = counts.flatten()[keep].double(), expected.flatten()[keep].double()
    exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


@pytest.mark.parametrize(
    "mode,kind,one_read",
    [
        ("deterministic", "plain", True),
        ("deterministic", "plain", False),
        ("iid", "temp", False),
        ("iid", "temp", True),
        ("without-replacement", "topk", False),
        ("without-replacement", "topp", False),
        ("without-replacement", "topp", True),
        ("deterministic", "topp", False),
        ("deterministic", "topp", True),
    ],
)
def test_tree_sampling_matches_target_distribution(mode, kind, one_read):
    torch.manual_seed(1)
    counts, expected = _joint_counts(mode, kind, 4000, one_read)
    assert _chi2_pvalue(counts, expected) > 1e-3


@pytest.mark.parametrize("one_read", [True, False])
def test_broken_residual_is_detected(monkeypatch, one_read):
    """The same test must fail for a classic bug: on rejection, keep sampling from p instead of the residual."""
    monkeypatch.setattr(acceptance, "_residual", lambda r, q: r)
    torch.manual_seed(1)
    counts, expected = _joint_counts("deterministic", "plain", 4000, one_read)
    assert _chi2_pvalue(counts, expected) < 1e-6


def _node_walk_greedy(tree: TokenTree, logits: torch.Tensor, ids: torch.Tensor, lp) -> tuple[list, list]:
    """The plain greedy walk, one node at a time: processors on the path ids, argmax, first child carrying it."""
    nodes, tokens, node = [], [], ROOT
    while True:
        target = int(processed_scores(lp, ids, logits[node + 1])[0].argmax())
        tokens.append(target)
        nxt = next((c for c in tree.children(node) if tree.token_list[c] == target), None)
        if nxt is None:
            return nodes, tokens
        nodes.append(nxt)
        ids = torch.cat([ids, ids.new_tensor([[target]])], dim=-1)
        node = nxt


class _Stateful:
    """A processor outside acceptance._STATELESS: it records every ids it is called with."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def __call__(self, ids, scores):
        self.seen.append(ids[0].tolist())
        return scores


@pytest.mark.parametrize("one_read", [None, False])
def test_greedy_with_repetition_penalty_matches_the_node_walk(one_read):
    """A repetition penalty makes the argmax depend on the accepted path (small vocabulary, repeated tokens)."""
    rng, accepted = random.Random(0), 0
    lp = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0)])
    for trial in range(200):
        adds = []
        for i in range(rng.randrange(0, 12)):
            parent = rng.choice([ROOT, *range(i)])
            free = [t for t in range(V) if (parent, t) not in {(p, t) for p, t in adds}]
            if free:
                adds.append((parent, rng.choice(free)))
        tree = TokenTree.from_additions(adds) if adds else TokenTree.empty()
        logits = torch.randn(1 + len(tree), V, generator=torch.Generator().manual_seed(trial))
        ids = torch.tensor([[rng.randrange(V), rng.randrange(V)]])
        with HostSyncCounter() as syncs:
            acc = accept_tree(tree, logits, ids, lp, one_read=one_read)
        nodes, tokens = _node_walk_greedy(tree, logits, ids, lp)
        assert (acc.nodes, acc.tokens) == (nodes, tokens), trial
        assert len(acc.scores) == len(acc.tokens)
        # stateless processors: one read per step (the default for greedy); else one per level on the path
        assert syncs.total == (1 if one_read is None else len(tokens)), syncs.by_kind
        accepted += len(nodes)
    assert accepted > 50


def test_stateful_processors_see_only_the_path_ids():
    """A processor outside the stateless set is called once per level, with the ids a plain loop would have."""
    tree = TokenTree.from_additions([(-1, 3), (-1, 4), (1, 2), (2, 0), (1, 1)])
    logits = torch.full((6, V), -5.0)
    logits[0, 4], logits[2, 2], logits[3, 1] = (
        5.0,
        5.0,
        5.0,
    )  # root -> 4 (node 1) -> 2 (node 2) -> 1: no child
    spy = _Stateful()
    acc = accept_tree(tree, logits, IDS, LogitsProcessorList([spy]))
    assert acc.nodes == [1, 2] and acc.tokens == [4, 2, 1]
    assert spy.seen == [[0, 1], [0, 1, 4], [0, 1, 4, 2]]
    with pytest.raises(ValueError, match="one_read"):
        accept_tree(tree, logits, IDS, LogitsProcessorList([spy]), one_read=True)


class _Oracle(TreeProposer):
    """A wrong sibling first, then a chain of the reference continuation (with one wrong token at depth 3)."""

    def __init__(self, reference: torch.Tensor, vocab: int):
        self.ref, self.vocab = reference[0].tolist(), vocab

    def propose(self, input_ids, max_depth):
        L = input_ids.shape[1]
        chain = self.ref[L : L + min(max_depth, 4)]
        if not chain:
            return TokenTree.empty(input_ids.device)
        adds = [(ROOT, (chain[0] + 1) % self.vocab)]
        for d, t in enumerate(chain):
            adds.append((len(adds) - 1 if d else ROOT, (t + 1) % self.vocab if d == 3 else t))
        return TokenTree.from_additions(adds, device=input_ids.device)


def test_greedy_with_repetition_penalty_matches_generate_and_reads_once_per_step():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = model.generate(prompt, max_new_tokens=24, do_sample=False, repetition_penalty=1.5)
    model.generation_config.max_length = prompt.shape[1] + 24
    lp = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])  # what generate builds for it
    oracle = _Oracle(reference, 97)
    with HostSyncCounter() as syncs, ForwardMeter(model) as meter:
        meter.syncs = syncs
        out = tree_generate(model, prompt, lp, proposer=oracle, generation_config=model.generation_config)
    assert torch.equal(out, reference)
    assert meter.calls < 24  # drafts were accepted: fewer forwards than tokens
    # one read per step (the acceptance); the generation's set-up reads its EOS ids and the stopping criteria's once
    assert syncs.total <= meter.calls + 2, syncs.by_kind


def test_sampling_reads_the_device_at_most_once_per_level():
    """Host reads of one sampling acceptance on a tiny model's logits: at most depth + 1 with a read per level,
    exactly one with ``one_read``; and through the decoding loop, at most depth + 1 per step."""
    model = tiny_llama()
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (1, 8), generator=torch.Generator().manual_seed(0))
    lp = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20)])
    q = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(1)), -1)
    toks, rows = sample_children(q, 3)
    adds = [(ROOT, t) for t in toks] + [(0, toks[1]), (3, toks[2]), (4, toks[0]), (1, toks[0])]
    probs = torch.cat([rows, q.expand(4, vocab)])
    tree = TokenTree.from_additions(adds, draft_probs=probs)
    with torch.no_grad():  # rows of a tiny model's logits, one per fed token (root + nodes)
        logits = model(torch.cat([prompt, tree.tokens[None]], 1)).logits[0, prompt.shape[1] - 1 :]
    torch.manual_seed(0)
    for _ in range(20):
        with HostSyncCounter() as per_level:
            acc = accept_tree(tree, logits, prompt, lp, do_sample=True, one_read=False)
        assert per_level.total == len(acc.tokens) <= tree.max_depth + 1
        with HostSyncCounter() as once:
            accept_tree(tree, logits, prompt, lp, do_sample=True, one_read=True)
        assert once.total == 1

    reference = model.generate(prompt, max_new_tokens=20, do_sample=True, top_k=20)  # the oracle's chain
    cfg = copy.deepcopy(model.generation_config)
    cfg.do_sample, cfg.max_length = True, prompt.shape[1] + 20
    oracle = _Oracle(reference, vocab)
    with HostSyncCounter() as syncs, ForwardMeter(model) as meter:
        meter.syncs = syncs
        tree_generate(model, prompt, lp, proposer=oracle, generation_config=cfg)
    levels = 4 + 1  # the oracle's trees are at most 4 deep
    assert syncs.total <= meter.calls * levels + 2, syncs.by_kind
