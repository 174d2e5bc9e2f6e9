"""Token tree structure, positions and the 4D tree mask, checked against plain forwards of each path."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from hf_specdec.core.tree import TokenTree, additive_mask
from hf_specdec.errors import SpecDecError

from .conftest import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


def random_tree(rng: random.Random, n: int, vocab: int = 97) -> TokenTree:
    return TokenTree.from_additions([(rng.randint(-1, i - 1), rng.randint(3, vocab - 1)) for i in range(n)])


def test_small_tree_mask_and_positions():
    #   root ─┬─ a(0) ── c(2)
    #         └─ b(1) ── d(3) ── e(4)
    tree = TokenTree.from_additions([(-1, 10), (-1, 11), (0, 12), (1, 13), (3, 14)])
    assert tree.depths == [1, 1, 2, 2, 3]
    assert tree.position_ids(7).tolist() == [[7, 8, 8, 9, 9, 10]]
    assert tree.flat_tokens(5).tolist() == [[5, 10, 11, 12, 13, 14]]
    expected = torch.tensor(
        [  # root a b c d e
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 0, 1, 0, 1, 0],
            [1, 0, 1, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_mask(), expected)
    full = tree.attention_mask(3)
    assert full.shape == (1, 1, 6, 9)
    assert full[0, 0, :, :3].all() and torch.equal(full[0, 0, :, 3:], expected)
    assert tree.path(4) == [1, 3, 4] and tree.children(-1) == [0, 1]


def test_chain_is_causal():
    tree = TokenTree.from_chain([4, 5, 6])
    assert tree.parents.tolist() == [-1, 0, 1] and tree.depths == [1, 2, 3]
    assert torch.equal(tree.ancestor_mask(), torch.ones(4, 4, dtype=torch.bool).tril())


def test_ancestor_mask_of_random_trees_matches_their_paths():
    rng = random.Random(3)
    for n in (1, 2, 9, 40):
        tree = random_tree(rng, n)
        expected = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        expected[:, 0] = True
        for node in range(n):
            expected[node + 1, [k + 1 for k in tree.path(node)]] = True
        assert torch.equal(tree.ancestor_mask(), expected), n


def test_empty_tree():
    tree = TokenTree.empty()
    assert len(tree) == 0 and tree.max_depth == 0
    assert tree.flat_tokens(9).tolist() == [[9]] and tree.position_ids(4).tolist() == [[4]]


def test_truncate_depth_keeps_ancestors_and_remaps():
    tree = TokenTree.from_additions([(-1, 10), (0, 11), (-1, 12), (1, 13), (2, 14)])
    cut = tree.truncate_depth(2)
    assert cut.tokens.tolist() == [10, 11, 12, 14]
    assert cut.parents.tolist() == [-1, 0, -1, 2]
    assert len(tree.truncate_depth(0)) == 0


@pytest.mark.parametrize(
    "tokens,parents,match",
    [
        ([1, 2], [-1, 1], "parent 1"),
        ([1, 2], [-1, -2], "parent -2"),
        ([1, 2], [-1], "equal length"),
        ([1, -3], [-1, 0], "non-negative"),
    ],
)
def test_validation_errors(tokens, parents, match):
    with pytest.raises(SpecDecError, match=match):
        TokenTree(torch.tensor(tokens), torch.tensor(parents))


def test_draft_probs_must_cover_own_token():
    q = torch.zeros(2, 5)
    q[0, 1] = 1.0
    q[1, 0] = 1.0  # node 1 is token 2, but q gives it probability 0
    with pytest.raises(SpecDecError, match="probability 0"):
        TokenTree.from_chain([1, 2], draft_probs=q)


def test_additive_mask_values():
    mask = torch.tensor([[True, False]])
    out = additive_mask(mask, torch.float32)
    assert out[0, 0] == 0 and out[0, 1] == torch.finfo(torch.float32).min


@pytest.mark.parametrize(
    "make,impl",
    [(tiny_llama, "sdpa"), (tiny_llama, "eager"), (tiny_gpt2, "sdpa"), (tiny_gpt2, "eager")],
)
def test_tree_forward_equals_plain_forward_of_each_path(make, impl):
    """Every node's logits in the ONE tree forward equal the last logits of a plain forward of its path."""
    model = make()
    model.set_attn_implementation(impl)
    rng = random.Random(0)
    for trial in range(2):
        prompt = torch.randint(3, 97, (1, 5 + trial), generator=torch.Generator().manual_seed(trial))
        prefix, root = prompt[:, :-1], int(prompt[0, -1])
        tree = random_tree(rng, 7)
        cache = DynamicCache(config=model.config)
        model(input_ids=prefix, past_key_values=cache, use_cache=True)
        P = prefix.shape[1]
        mask = additive_mask(tree.attention_mask(P), model.dtype)
        out = model(
            input_ids=tree.flat_tokens(root),
            position_ids=tree.position_ids(P),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        ).logits[0]
        for node in range(-1, len(tree)):
            path = tree.tokens[tree.path(node)] if node >= 0 else tree.tokens[:0]
            ref = model(input_ids=torch.cat([prompt, path[None]], dim=1)).logits[0, -1]
            torch.testing.assert_close(out[node + 1], ref, atol=1e-5, rtol=1e-4)


def test_boolean_mask_is_misread_by_eager_attention():
    """Why ``additive_mask`` exists: eager attention adds the mask to the scores, so a boolean mask is wrong."""
    model = tiny_llama()
    model.set_attn_implementation("eager")
    tree = TokenTree.from_additions([(-1, 10), (-1, 11)])
    ids = tree.flat_tokens(5)
    good = model(
        input_ids=ids,
        position_ids=tree.position_ids(0),
        attention_mask=additive_mask(tree.attention_mask(0), torch.float32),
    )
    bad = model(input_ids=ids, position_ids=tree.position_ids(0), attention_mask=tree.attention_mask(0))
    assert not torch.allclose(good.logits, bad.logits, atol=1e-4)
