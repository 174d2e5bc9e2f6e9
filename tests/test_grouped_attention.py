"""grouped_attention.py: SDPA on grouped key/value heads under a mask gives sdpa's numbers, without the copies."""

import torch
import torch.nn.functional as F

import hf_specdec
from hf_specdec import grouped_attention
from hf_specdec.core.proposer import TreeProposer
from hf_specdec.core.tree import TokenTree, additive_mask
from hf_specdec.core.tree_decoding import tree_generate
from hf_specdec.hf_compat import attn_implementation

from .conftest import tiny_gpt2, tiny_llama


def _masked_step(model, ids: torch.Tensor, tree: TokenTree) -> torch.Tensor:
    """Logits of a tree verification forward (a 4D mask) whose root is the last of ``ids``."""
    from transformers import DynamicCache

    cache, prefix = DynamicCache(), ids.shape[1] - 1
    model(ids[:, :-1], past_key_values=cache)
    mask = additive_mask(tree.attention_mask(prefix), torch.float32)
    fed = tree.flat_tokens(ids[0, -1])
    return model(
        fed, past_key_values=cache, attention_mask=mask, position_ids=tree.position_ids(prefix)
    ).logits


def test_a_masked_step_matches_sdpa_and_runs_sdpa_on_the_grouped_heads(monkeypatch):
    model = tiny_llama(attn_implementation="sdpa")
    ids = torch.randint(3, 97, (1, 40))
    tree = TokenTree(tokens=torch.tensor([5, 6, 7, 8]), parents=torch.tensor([-1, 0, 0, 1]))
    expected = _masked_step(model, ids, tree)
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append((args[1].shape[1], kwargs.get("enable_gqa", False), kwargs.get("attn_mask") is not None))
        return sdpa(*args, **kwargs)

    assert grouped_attention.use_grouped_attention(model)
    assert attn_implementation(model) == grouped_attention.NAME
    monkeypatch.setattr(grouped_attention.F, "scaled_dot_product_attention", counting)
    got = _masked_step(model, ids, tree)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # the masked tree step of each of the 2 layers: the 2 key/value heads as they are, not repeated to 4
    assert [(heads, gqa) for heads, gqa, masked in calls if masked] == [(2, True), (2, True)]
    grouped_attention.restore_attention(model)
    assert attn_implementation(model) == "sdpa"


def test_it_changes_nothing_where_it_cannot_help():
    assert "eager" in grouped_attention.unavailable(tiny_llama(attn_implementation="eager"))
    assert "groups" in grouped_attention.unavailable(
        tiny_llama(num_key_value_heads=4, attn_implementation="sdpa")
    )
    gpt2 = tiny_gpt2()
    assert not grouped_attention.use_grouped_attention(gpt2)
    assert attn_implementation(gpt2) != grouped_attention.NAME


class _Chain(TreeProposer):
    def propose(self, input_ids, max_depth):
        return TokenTree.from_chain(input_ids[0, -3:].tolist(), device=input_ids.device)


def test_plain_generate_and_tree_decoding_agree_after_apply_kernels():
    model = tiny_llama(attn_implementation="sdpa")
    ids = torch.randint(3, 97, (1, 30))
    before = model.generate(ids, max_new_tokens=20, do_sample=False)
    report = hf_specdec.apply_kernels(model, measure=False)
    assert attn_implementation(model) == grouped_attention.NAME and "grouped" in report.attention
    plain = model.generate(ids, max_new_tokens=20, do_sample=False)
    tree = model.generate(
        ids, max_new_tokens=20, do_sample=False, custom_generate=tree_generate, proposer=_Chain()
    )
    assert torch.equal(plain, before) and torch.equal(tree, plain)
    hf_specdec.restore_kernels(model)
    assert attn_implementation(model) == "sdpa"
