"""Every method on tiny targets of six architectures (``tests/tiny_architectures.py``): Llama, Qwen2 (attention
biases), Qwen3 (q/k norms), Gemma 3 (sandwich norms, sliding and full-attention layers), Mistral (sliding window) and
Phi-3 (fused projections, partial rotary). PLD+(h) and PLD+(a), GLIDE's chain and CAPE, EDD's chain and PCT, SPACE,
at batch 1 and in a left-padded batch of 4, each token-identical to plain greedy ``generate``, drafting past the
sliding window (prompt + generation cross it); tree verification past the window node by node; sampling through
CAPE trees on the two sliding-window architectures. Training: ``test_architecture_training.py``."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM
from transformers import DynamicCache

import hf_specdec
from hf_specdec.core.assisted import batch_stats
from hf_specdec.core.sliding_window import LayerMasks
from hf_specdec.core.stats import DecodeStats
from hf_specdec.core.tree import TokenTree
from hf_specdec.core.tree_decoding import TreeProposer, tree_generate
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.edd.tree_proposer import EddTreeProposer
from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import cache_of
from hf_specdec.pld_plus.induction_heads import write_heads_file

from .conftest import assert_pairs_follow_target, batch_pair_counts, left_pad, warped_next_token
from .test_glide_model import _drafter
from .tiny_architectures import ARCHITECTURES, WINDOW, tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, NEW = 64, 24
METHODS = ("pld-plus-h", "pld-plus-a", "glide-chain", "glide-cape", "edd-chain", "edd-pct", "space")
BATCH_1_ONLY = {
    "pld-plus-a": "PLD\\+\\(a\\) and the attribution run at batch size 1",
}


@functools.cache
def _target(arch: str, space: bool = False):
    """The architecture's tiny target; for SPACE one whose argmax is mostly among a few tokens, with the last id as
    its mask token (``test_space_decoding._peaked``): its mask guesses are then accepted now and then."""
    model = tiny_target(arch, VOCAB)
    if space:
        head = model.get_output_embeddings().weight
        with torch.no_grad():
            head[3:6] += torch.randn(3, head.shape[1], generator=torch.Generator().manual_seed(1)) * 3
        model.config.space_k, model.config.space_mask_token_id = 3, VOCAB - 1
    return model


@functools.cache
def _edd(arch: str) -> EddForCausalLM:
    target = _target(arch)
    torch.manual_seed(0)
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    edd.chain_cost = False  # the papers' fixed gamma: a random drafter would not pay for a draft by its cost
    return edd.attach_target(target)


def _prompts(batch: int) -> list[torch.Tensor]:
    """Prompts that repeat their first half (PLD+ finds occurrences), 15 to 24 tokens: with 24 new tokens every
    sequence crosses the window of 16."""
    out = []
    for row in range(batch):
        base = torch.randint(3, VOCAB - 1, (10 + 2 * row,), generator=torch.Generator().manual_seed(row))
        out.append(torch.cat([base, base[: 5 + row]]))
    return out


@functools.cache
def _reference(arch: str, batch: int, space: bool = False) -> torch.Tensor:
    ids, mask = left_pad(_prompts(batch))
    return _target(arch, space).generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW)


def _method(arch: str, method: str, tmp_path) -> dict:
    """``generate`` keywords of ``method`` on the architecture's target."""
    cheap = dict(custom_generate=hf_specdec.pld_plus, pld_min_score=-1, pld_cost=CostCurve.linear(0.02))
    if method == "pld-plus-h":
        return cheap
    if (
        method == "pld-plus-a"
    ):  # any heads will do for a random model (test_pld_plus gives heads the same way)
        heads = [{"layer": layer, "head": head, "score": 0.5} for layer, head in ((1, 0), (0, 3), (1, 2))]
        path = write_heads_file(tmp_path / "heads.json", _target(arch), heads, task="test")
        return dict(cheap, pld_variant="attention", pld_heads=path)
    if (
        method == "glide-chain"
    ):  # the papers' fixed gamma: a random drafter would not pay for a draft by its cost
        drafter = _drafter(_target(arch))
        drafter.chain_cost = False
        return dict(assistant_model=drafter)
    if method == "glide-cape":
        return dict(custom_generate=hf_specdec.glide_cape, drafter=_drafter(_target(arch)), cape_cost=False)
    if method == "edd-chain":
        return dict(assistant_model=_edd(arch))
    if method == "edd-pct":
        return dict(custom_generate=tree_generate, proposer=EddTreeProposer(_edd(arch), "pct", ratio=0.05))
    return dict(custom_generate=hf_specdec.space, num_masks=3)


class Verifications:
    """``(first position, tokens fed)`` of each forward of ``model`` inside the block."""

    def __init__(self, model):
        self.model, self.seen = model, []

    def _hook(self, module, args, kwargs):
        ids, positions = kwargs.get("input_ids", args[0] if args else None), kwargs.get("position_ids")
        cache = cache_of(kwargs)
        start = int(positions.max()) if positions is not None else (cache.get_seq_length() if cache else 0)
        self.seen.append((start, ids.shape[1]))

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def drafts_past(self, position: int) -> bool:
        """Whether a forward after the prefill verified drafts at or past ``position``."""
        return any(fed > 1 and start >= position for start, fed in self.seen[1:])


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_method_is_lossless_on_every_architecture(arch, method, batch, tmp_path):
    target = _target(arch, space=method == "space")
    ids, mask = left_pad(_prompts(batch))
    kwargs = _method(arch, method, tmp_path)
    if batch > 1 and method in BATCH_1_ONLY:
        with pytest.raises(SpecDecError, match=BATCH_1_ONLY[method]):
            target.generate(ids, attention_mask=mask, max_new_tokens=NEW, **kwargs)
        return
    stats = DecodeStats()
    if "custom_generate" in kwargs:
        kwargs["stats"] = stats
    with Verifications(target) as seen, batch_stats(stats):
        out = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, **kwargs)
    assert torch.equal(out, _reference(arch, batch, space=method == "space"))
    assert seen.drafts_past(WINDOW), (
        seen.seen
    )  # drafting goes on past the window (no fallback to plain steps)
    if batch > 1 or method in ("glide-cape", "edd-pct", "space"):  # the loops that fill stats
        assert stats.drafted > 0


class Oracle(TreeProposer):
    """Random trees around each row's true continuation (``refs``, found by the row's prompt): a chain of the reference
    tokens, each corrupted with probability 0.3, and random nodes (``test_batching.RowOracle`` over this vocabulary)."""

    def __init__(self, refs: list[list[int]]):
        self.refs = refs

    def start(self, model, input_ids, generation_config):
        self.rng = random.Random(input_ids.shape[1])
        self.ref = next(r for r in self.refs if r[: input_ids.shape[1]] == input_ids[0].tolist())

    def propose(self, input_ids, max_depth):
        n, rng = input_ids.shape[1], self.rng
        adds = [(rng.randint(-1, i - 1), rng.randrange(3, VOCAB)) for i in range(rng.randint(0, 4))]
        parent = -1
        for token in self.ref[n : n + rng.randint(1, 6)]:
            adds.append((parent, rng.randrange(3, VOCAB) if rng.random() < 0.3 else token))
            parent = len(adds) - 1
        return TokenTree.from_additions(adds)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_trees_of_the_true_continuation_are_accepted_past_the_window(arch, batch):
    """Random trees around the reference continuation (``test_batching.RowOracle``): most tokens come from accepted
    drafts, also after the window, and the output is plain greedy's."""
    target = _target(arch)
    ref = _reference(arch, batch)
    ids, mask = left_pad(_prompts(batch))
    refs = [row[int((mask[i] == 0).sum()) :].tolist() for i, row in enumerate(ref)]
    stats = DecodeStats()
    with Verifications(target) as seen:
        out = target.generate(
            ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, custom_generate=tree_generate,
            proposer=Oracle(refs), stats=stats,
        )  # fmt: skip
    assert torch.equal(out, ref)
    assert stats.accepted >= batch * NEW // 3 and seen.drafts_past(WINDOW + 8)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_tree_forward_past_the_window_gives_each_node_its_path_logits(arch):
    """One verification forward of a branching tree after 20 cached tokens (past the window of 16): the logits at
    each node equal those of a plain forward over the prefix and the node's path."""
    target = _target(arch)
    ids = torch.randint(3, VOCAB, (1, 21), generator=torch.Generator().manual_seed(5))
    tree = TokenTree.from_additions([(-1, 7), (0, 8), (1, 9), (-1, 10), (3, 11), (0, 12)])
    cache = DynamicCache()
    with torch.no_grad():
        target(ids[:, :-1], past_key_values=cache, use_cache=True)
        positions = tree.position_ids(20)
        masks = LayerMasks(target).after_prefix(tree.attention_mask(20), positions, 20)
        assert isinstance(masks, dict) == (arch == "gemma3")  # full and sliding layers: a mask per layer type
        fed = tree.flat_tokens(ids[0, -1])
        logits = target(fed, position_ids=positions, attention_mask=masks, past_key_values=cache).logits[0]
        for node in range(-1, len(tree)):
            path, at = [], node
            while at != -1:
                path.insert(0, int(tree.tokens[at]))
                at = tree.parent_list[at]
            plain = target(torch.cat([ids, torch.tensor([path], dtype=torch.long)], 1)).logits[0, -1]
            torch.testing.assert_close(logits[node + 1], plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_cape_sampling_follows_the_target_past_the_window(arch):
    """Tokens 2-3 sampled through CAPE trees (gamma 2, full S(p)) in a batch of two rows, one of them past the
    window: each row's pairs follow the target's joint distribution after its prompt (chi-square)."""
    pytest.importorskip("scipy.stats")
    vocab = 6
    target = tiny_target(arch, vocab, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(8.0)  # a peaked target, so that a wrong rule shows
    drafter = _drafter(target, seed=4)
    prompts = [
        torch.tensor([1, 4, 2]),
        torch.randint(0, vocab, (18,), generator=torch.Generator().manual_seed(0)),
    ]
    temperature, top_k = 0.8, 4
    torch.manual_seed(0)
    stats = DecodeStats()
    counts = batch_pair_counts(
        target, prompts, 300, vocab, temperature=temperature, top_k=top_k, custom_generate=hf_specdec.glide_cape,
        drafter=drafter, cape_gamma=2, cape_cost=False, stats=stats,
    )  # fmt: skip
    assert stats.drafted > 0 and stats.accepted > 0
    for i, prompt in enumerate(prompts):
        assert_pairs_follow_target(counts[i], prompt[None], warped_next_token(target, temperature, top_k))
