"""Tree acceptance rules: greedy longest match, and tree speculative sampling reproduces the target distribution.

The sampling tests use a synthetic target over a 5-token vocabulary (no model): ``T[x]`` are the logits of
the next token after token ``x``, ``root_logits`` those after the committed prefix. The tree's logits rows
are then ``T[node token]``, exactly what a target would give. Chi-square on the joint of the first two
emitted tokens against ``p0(x1) * p(x2 | x1)``; a deliberately broken residual update must fail it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import hf_specdec.core.acceptance as acceptance
from hf_specdec.core.acceptance import accept_tree, sample_children
from hf_specdec.core.tree import TokenTree

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


def _joint_counts(mode: str, kind: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    lp = _processors(kind)
    counts = torch.zeros(V, V)
    for _ in range(n):
        tree = _draft_tree(mode)
        logits = torch.cat([ROOT_LOGITS[None], T[tree.tokens]])
        acc = accept_tree(tree, logits, IDS, lp, do_sample=True)
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
    "mode,kind",
    [
        ("deterministic", "plain"),
        ("iid", "temp"),
        ("without-replacement", "topk"),
        ("without-replacement", "topp"),
        ("deterministic", "topp"),
    ],
)
def test_tree_sampling_matches_target_distribution(mode, kind):
    torch.manual_seed(1)
    counts, expected = _joint_counts(mode, kind, 4000)
    assert _chi2_pvalue(counts, expected) > 1e-3


def test_broken_residual_is_detected(monkeypatch):
    """The same test must fail for a classic bug: on rejection, keep sampling from p instead of the residual."""
    monkeypatch.setattr(acceptance, "_residual", lambda r, q: r)
    torch.manual_seed(1)
    counts, expected = _joint_counts("deterministic", "plain", 4000)
    assert _chi2_pvalue(counts, expected) < 1e-6


def test_sample_children_conditionals():
    q = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0])
    toks, rows = sample_children(q, 5)
    assert len(toks) == 3 and len(set(toks)) == 3  # capped by the support, no duplicates
    torch.testing.assert_close(rows[0], q)
    assert rows[1][toks[0]] == 0 and abs(float(rows[1].sum()) - 1) < 1e-6
