"""PCT and the tree baselines (EDD, ACL 2025, §3.2, Fig. 4, App. A) on constructed confidence trees, and EDD trees
through the tree-verification core (lossless)."""

from __future__ import annotations

import pytest
import torch

from hf_specdec.core.tree import ROOT
from hf_specdec.edd.pct import GrownTree, StepTimer, grow_eagle2, grow_fixed, grow_pct, rerank

VOCAB = 50


def dist(top: dict[int, float]) -> torch.Tensor:
    """A distribution with the given probabilities; the rest spread evenly (each below every given one)."""
    p = torch.zeros(VOCAB)
    for t, v in top.items():
        p[t] = v
    rest = [t for t in range(VOCAB) if t not in top]
    p[rest] = (1.0 - sum(top.values())) / len(rest)
    return p


class FakeExpander:
    """Children distributions keyed by the token path from the root; records what it was asked to expand."""

    def __init__(self, table: dict[tuple, torch.Tensor], default: torch.Tensor | None = None):
        self.table, self.default, self.calls = table, default, []

    def path(self, node: int, tree: GrownTree) -> tuple:
        out = []
        while node != ROOT:
            out.append(tree.tokens[node])
            node = tree.parents[node]
        return tuple(reversed(out))

    def expand(self, nodes, tree):
        paths = [self.path(n, tree) for n in nodes]
        self.calls.append(paths)
        return torch.stack([self.table.get(p, self.default) for p in paths])


def paths_of(tree: GrownTree) -> set[tuple]:
    exp = FakeExpander({})
    return {exp.path(i, tree) for i in range(len(tree))}


FIG4_LIKE = {
    (): dist({1: 0.6, 2: 0.3}),
    (1,): dist({3: 0.5, 4: 0.3}),
    (2,): dist({3: 0.3, 5: 0.1}),
    (1, 3): dist({5: 0.9, 6: 0.05}),
    (1, 4): dist({7: 0.4, 8: 0.3}),
}


def test_pct_keeps_exactly_the_nodes_the_rule_keeps():
    # s_d/s_t = 0.1: expand nodes with p >= 0.1; remove nodes with p < 0.05 (Fig. 4's thresholds); width 2.
    exp = FakeExpander(FIG4_LIKE)
    tree = grow_pct(exp, expand_threshold=0.1, width=2, max_depth=3, removal_threshold=0.05)
    assert paths_of(tree) == {(1,), (2,), (1, 3), (1, 4), (2, 3), (1, 3, 5), (1, 4, 7), (1, 4, 8)}
    # removed: (2, 5) p=0.03, (1, 3, 6) p=0.015; (2, 3) p=0.09 is kept but never expanded
    assert exp.calls == [[()], [(1,), (2,)], [(1, 3), (1, 4)]]
    est = {p: e for p, e in zip([FakeExpander({}).path(i, tree) for i in range(len(tree))], tree.estimate)}
    assert est[(1, 4, 7)] == pytest.approx(0.6 * 0.3 * 0.4)
    assert tree.expansions == 3
    # topological order, parents kept
    assert all(p < i for i, p in enumerate(tree.parents))
    tt = tree.token_tree()
    assert len(tt) == 8 and tt.max_depth == 3


def test_pct_without_removal_and_with_high_threshold():
    full = grow_pct(
        FakeExpander(FIG4_LIKE), expand_threshold=0.1, width=2, max_depth=3, removal_threshold=0.0
    )
    assert len(full) == 10  # the 8 above + (2, 5) + (1, 3, 6)
    only_root = grow_pct(
        FakeExpander(FIG4_LIKE), expand_threshold=0.7, width=2, max_depth=3, removal_threshold=0.0
    )
    assert paths_of(only_root) == {(1,), (2,)}  # no child of the root reaches 0.7: depth 1


def test_pct_depth_adapts_to_confidence():
    confident = FakeExpander({}, default=dist({7: 0.95, 8: 0.03}))
    unsure = FakeExpander({}, default=dist({7: 0.3, 8: 0.2}))
    deep = grow_pct(confident, expand_threshold=0.1, width=5, max_depth=10, removal_threshold=0.01)
    shallow = grow_pct(unsure, expand_threshold=0.1, width=5, max_depth=10, removal_threshold=0.01)
    assert deep.max_depth == 10  # 0.95^10 = 0.60 >= 0.1 all the way down
    assert shallow.max_depth == 2  # 0.3 and 0.2 expand; their children (<= 0.09) do not
    assert shallow.expansions == 2 and deep.expansions == 10
    # a higher s_d/s_t (slower drafter relative to the target) gives a smaller tree
    small = grow_pct(FakeExpander({}, default=dist({7: 0.95, 8: 0.03})), 0.7, 5, 10, 0.01)
    assert small.max_depth < deep.max_depth and len(small) < len(deep)


def test_vct_is_the_full_tree():
    tree = grow_fixed(FakeExpander({}, default=dist({1: 0.5, 2: 0.3, 3: 0.1})), width=3, depth=3)
    assert len(tree) == 3 + 9 + 27 and tree.max_depth == 3 and tree.expansions == 3


def test_eagle2_reranks_to_total_tokens_and_stays_connected():
    exp = FakeExpander({}, default=dist({1: 0.5, 2: 0.2, 3: 0.1}))
    tree = grow_eagle2(exp, topk=3, depth=4, total_tokens=10)
    assert len(tree) == 10
    assert all(p == ROOT or p < i for i, p in enumerate(tree.parents))
    # only the top-3 nodes of each layer are expanded
    assert [len(c) for c in exp.calls] == [1, 3, 3, 3]
    # the kept nodes are the 10 best estimates among the candidates
    full = GrownTree()
    for t, p, c in [(1, -1, 0.5), (2, -1, 0.2), (3, 0, 0.9)]:
        full.add(t, p, c)
    assert paths_of(rerank(full, 2)) == {(1,), (1, 3)}


def test_step_timer_ratio():
    timer = StepTimer(initial_ratio=0.2)
    assert timer.ratio == 0.2
    timer.calibrate(0.01, 0.1)
    assert timer.ratio == pytest.approx(0.1)
    timer.draft(0.03)
    assert timer.s_d == pytest.approx(0.9 * 0.01 + 0.1 * 0.03)
    assert StepTimer(fixed_ratio=0.05).ratio == 0.05


# ------------------------------------------------------------------ EDD trees through the tree core
@pytest.mark.parametrize("builder", ["pct", "vct", "eagle2", "chain"])
def test_edd_trees_are_lossless_greedy_and_replay_exactly(target_and_edd, builder):
    """Each EDD tree gives plain greedy's tokens, and `hf-specdec tree-replay` reproduces its target forwards and
    verified nodes exactly."""
    from hf_specdec.core.stats import DecodeStats
    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer
    from hf_specdec.edd.tree_replay import replay_tree

    target, edd = target_and_edd
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
    proposer = EddTreeProposer(edd, builder, ratio=0.1 if builder == "pct" else None)
    for seed in range(2):
        torch.manual_seed(seed)
        ids = torch.randint(3, 90, (1, 8))
        stats = DecodeStats()
        out = target.generate(ids, custom_generate=tree_generate, proposer=proposer, stats=stats, **kw)
        assert torch.equal(out, target.generate(ids, **kw))
        assert stats.target_forwards < 24  # drafts were accepted
        assert stats.drafted > 0
        with torch.no_grad():
            states = target(out, output_hidden_states=True).hidden_states[edd.config.encoder_layer]
        r = replay_tree(proposer, out[0], ids.shape[1], states, ids.shape[1] + 24)
        assert (r.new_tokens, r.forwards, r.nodes) == (stats.new_tokens, stats.target_forwards, stats.drafted)


def test_edd_tree_step_matches_chain_computation(target_and_edd):
    """EDD's tree forward (one query per node, tree mask) gives the same distribution at a node as running the
    path as a chain."""
    from hf_specdec.edd.draft_state import EddDraftState
    from hf_specdec.edd.tree_proposer import EddTreeExpander

    target, edd = target_and_edd
    if edd.target is not target:
        edd.attach_target(target)
    ids = torch.randint(3, 90, (1, 7))
    with torch.no_grad():
        h = target.base_model(ids[:, :-1], output_hidden_states=True).hidden_states[edd.config.encoder_layer]
        state = EddDraftState(edd)
        state.push_hidden(h)
        exp = EddTreeExpander(state, ids)
        tree = grow_fixed(exp, width=2, depth=3)  # feeds the root, then 2, then 4 nodes
        node = max(
            i for i in range(len(tree)) if tree.depth[i] == 2
        )  # fed, its parent fed in an earlier step
        probs_tree = exp.expand([node], tree)[0]  # fed again in a later step: sees root + ancestors only
        path = []
        n = node
        while n != ROOT:
            path.append(tree.tokens[n])
            n = tree.parents[n]
        path = path[::-1]
        x = torch.cat([h, edd.embed(torch.cat([ids[:, -1:], torch.tensor([path])], dim=1))], dim=1)
        ref = edd.draft_logits(edd.decode(x, torch.arange(x.shape[1])[None])[:, -1]).softmax(-1)[0]
    torch.testing.assert_close(probs_tree, ref, rtol=1e-4, atol=1e-6)


class NodeByNode:
    """An expander that drafts each listed node in its own forward (what level batching replaces)."""

    def __init__(self, inner):
        self.inner, self.token_ids = inner, inner.token_ids

    def expand(self, nodes, tree):
        return torch.cat([self.inner.expand([node], tree) for node in nodes])


@pytest.mark.parametrize("grow", ["pct", "vct"])
def test_level_batched_drafting_builds_the_node_by_node_tree(target_and_edd, grow):
    """A whole tree level in one EDD forward (tree mask over the frontier) gives the tree that one forward per node
    gives: the same tokens and parents, the same confidences, in fewer drafter forwards."""
    from hf_specdec.edd.draft_state import EddDraftState
    from hf_specdec.edd.tree_proposer import EddTreeExpander

    target, edd = target_and_edd
    if edd.target is not target:
        edd.attach_target(target)
    torch.manual_seed(3)
    ids = torch.randint(3, 90, (1, 9))
    trees, forwards = [], []
    with torch.no_grad():
        h = target.base_model(ids[:, :-1], output_hidden_states=True).hidden_states[edd.config.encoder_layer]
        for wrap in (lambda e: e, NodeByNode):
            state = EddDraftState(edd)
            state.push_hidden(h)
            exp = wrap(EddTreeExpander(state, ids, temperature=0.5))
            tree = (
                grow_pct(exp, 1e-4, 3, 3, removal_threshold=0.0) if grow == "pct" else grow_fixed(exp, 2, 3)
            )
            trees.append(tree)
            forwards.append(state.forwards)
    level, node = trees
    assert (level.tokens, level.parents, level.depth) == (node.tokens, node.parents, node.depth)
    torch.testing.assert_close(
        torch.tensor(level.confidence), torch.tensor(node.confidence), rtol=1e-4, atol=1e-6
    )
    assert len(level) > level.max_depth  # some level had several nodes, so the two really differ in forwards
    assert forwards[0] == level.expansions < forwards[1]


def test_accepted_length_follows_the_matching_path():
    from hf_specdec.edd.tree_replay import accepted_length

    tree = GrownTree()
    a = tree.add(5, ROOT, 0.5)
    tree.add(6, ROOT, 0.3)
    b = tree.add(7, a, 0.5)
    tree.add(8, a, 0.4)
    tree.add(9, b, 0.9)
    assert accepted_length(tree, [5, 7, 9, 1]) == 3
    assert accepted_length(tree, [5, 8, 9]) == 2
    assert accepted_length(tree, [6, 7]) == 1
    assert accepted_length(tree, [4]) == 0
    assert accepted_length(tree, [5, 7]) == 2  # the reference ends inside the tree


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--builders", "pct,foo"], "unknown EDD tree builder 'foo'"),
        (["--widths", "5,x"], "comma-separated list of numbers"),
        (["--temperatures", "0.9,0"], "confidence_temperature must be > 0"),
        (["--tasks", "nope"], "unknown task 'nope'"),
    ],
)
def test_tree_replay_bad_arguments_fail_before_loading(monkeypatch, capsys, argv, message):
    import hf_specdec.target
    from hf_specdec.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("loaded a model before checking the arguments")

    monkeypatch.setattr(hf_specdec.target, "load_target", no_loading)
    assert main(["tree-replay", *argv]) == 2
    assert message in capsys.readouterr().err


def test_level_mask_lets_each_node_see_the_prefix_root_fed_ancestors_and_itself(target_and_edd):
    """EddDraftState.level_mask (one gather per level) against a walk up the tree per node, on random trees fed
    in random groups of frontier nodes (some past the 64-row buffer it starts with, so it grows)."""
    import random

    from hf_specdec.edd.draft_state import EddDraftState

    rng = random.Random(5)
    for _ in range(20):
        tree = GrownTree()
        for i in range(rng.choice([rng.randint(1, 30), rng.randint(64, 150)])):
            tree.add(rng.randint(3, 90), rng.randint(ROOT, i - 1), 0.5)
        state = EddDraftState(target_and_edd[1])
        state.n_prefix = n_prefix = rng.randint(0, 5)
        fed, todo = [], list(range(len(tree)))
        while todo:
            ready = [n for n in todo if tree.parents[n] == ROOT or tree.parents[n] in fed]
            nodes = rng.sample(ready, rng.randint(1, len(ready)))
            mask = state.level_mask(nodes, tree)
            cache = n_prefix + 1 + len(fed)
            expected = torch.zeros(len(nodes), cache + len(nodes), dtype=torch.bool)
            expected[:, : n_prefix + 1] = True
            for row, node in enumerate(nodes):
                expected[row, cache + row] = True
                parent = tree.parents[node]
                while parent != ROOT:
                    expected[row, n_prefix + 1 + fed.index(parent)] = True
                    parent = tree.parents[parent]
            assert torch.equal(mask, expected)
            fed += nodes
            todo = [n for n in todo if n not in nodes]
