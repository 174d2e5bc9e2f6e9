"""EDD (ACL 2025, §3.1): dual-block mask, KL loss, the model's training/inference consistency, Auto classes,
wrong-target error, lossless chain decoding through transformers' assisted loop."""

from __future__ import annotations

import math

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM
from hf_specdec.modeling.masks import dual_block_mask
from hf_specdec.trainers.drafters.losses import ce_loss, draft_loss, kl_loss

import hf_specdec  # noqa: F401  (installs the assistant hook)
from hf_specdec.errors import SpecDecError
from tests.conftest import tiny_llama


def _reference_mask(n: int, L: int) -> torch.Tensor:
    m = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for i in range(n):
        for k in range(n):
            m[i, k] = k <= i  # soft prompt: causal
            start = (i // L) * L
            m[n + i, k] = k < start  # hidden states of earlier blocks
            m[n + i, n + k] = start <= k <= i  # own block, causal
    return m


def test_dual_block_mask_figure_3a_example():
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 0, 1, 0],
            [1, 1, 0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(dual_block_mask(4, 2), expected)


@pytest.mark.parametrize("n,L", [(7, 1), (7, 2), (9, 3), (12, 5), (10, 10), (6, 8)])
def test_dual_block_mask_matches_definition(n, L):
    assert torch.equal(dual_block_mask(n, L), _reference_mask(n, L))


def test_dual_block_mask_rejects_bad_length():
    with pytest.raises(ValueError):
        dual_block_mask(4, 0)


def test_kl_loss_hand_computation():
    draft = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]))
    target = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.2, 0.6]]))
    row0 = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.25) + 0.1 * math.log(0.1 / 0.25)
    expected = (row0 + 0.0) / 2  # identical distributions contribute 0
    assert kl_loss(draft, target).item() == pytest.approx(expected, rel=1e-5)
    # direction matters: KL(P_t || P_d), not KL(P_d || P_t)
    reverse = 0.5 * math.log(0.5 / 0.7) + 0.25 * math.log(0.25 / 0.2) + 0.25 * math.log(0.25 / 0.1)
    assert kl_loss(draft, target).item() != pytest.approx(reverse / 2, rel=1e-3)
    assert draft_loss("kl", draft, torch.tensor([0, 2]), target).item() == pytest.approx(expected, rel=1e-5)


def test_ce_loss_and_ignored_labels():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]))
    assert ce_loss(logits, torch.tensor([0, -100])).item() == pytest.approx(-math.log(0.5), rel=1e-5)
    assert ce_loss(logits, torch.tensor([-100, -100])).item() == 0.0
    with pytest.raises(ValueError):
        draft_loss("kl", logits, torch.tensor([0, 1]), None)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_hidden_layers=4)


@pytest.fixture(scope="module")
def edd(target):
    torch.manual_seed(1)
    model = EddForCausalLM(EddConfig.for_target(target)).eval()
    model.attach_target(target)
    return model


def test_config_defaults_follow_the_paper(target, edd):
    cfg = edd.config
    assert cfg.encoder_layer == 1  # hidden_states[-4] of a 4-layer target (5 entries: embeddings + 4 layers)
    assert cfg.layer_config["model_type"] == "llama" and cfg.layer_config["num_hidden_layers"] == 1
    assert (cfg.block_min, cfg.block_max, cfg.loss) == (5, 10, "kl")
    assert len(edd.decoder.layers) == 1 and edd.decoder.embed_tokens is None
    with pytest.raises(SpecDecError):
        EddConfig.for_target(target, encoder_layer=9)


def test_training_pass_equals_inference_with_verified_soft_prompt(target, edd):
    """Token i of block j in the teacher-forced pass == EDD run on [h_0..h_{jL-1}] + tokens x_{jL}..x_i."""
    ids = torch.randint(3, 90, (1, 11))
    with torch.no_grad():
        h = target.base_model(ids, output_hidden_states=True).hidden_states[edd.config.encoder_layer]
        L = 4
        trained = edd.hidden_states(ids, soft_prompt=h, block_length=L)
        for i in (0, 3, 4, 6, 10):
            start = (i // L) * L
            x = torch.cat([h[:, :start], edd.embed(ids[:, start : i + 1])], dim=1)
            ref = edd.decode(x, torch.arange(i + 1)[None])[:, -1]
            torch.testing.assert_close(trained[:, i], ref, rtol=1e-4, atol=1e-5)


def test_no_leak_from_later_hidden_states_or_earlier_blocks(target, edd):
    ids = torch.randint(3, 90, (1, 10))
    h = torch.randn(1, 10, target.config.hidden_size)
    with torch.no_grad():
        base = edd.hidden_states(ids, soft_prompt=h, block_length=5)
        h2 = h.clone()
        h2[:, 5:] += 1.0  # hidden states of block 1 must not reach block 1's tokens
        ids2 = ids.clone()
        ids2[0, 2] = (ids[0, 2] + 1) % 90  # a token of block 0 must not reach block 1 directly
        other = edd.hidden_states(ids, soft_prompt=h2, block_length=5)
        other_tok = edd.hidden_states(ids2, soft_prompt=h, block_length=5)
    torch.testing.assert_close(base, other)
    torch.testing.assert_close(base[:, 5:], other_tok[:, 5:])
    assert not torch.allclose(base[:, 2:5], other_tok[:, 2:5])


def test_save_load_auto_class_and_no_duplicated_embeddings(tmp_path, target, edd):
    from transformers import AutoModelForCausalLM

    edd.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    keys = load_file(tmp_path / "model.safetensors").keys()
    assert not any("embed" in k or "lm_head" in k for k in keys)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded, EddForCausalLM)
    loaded.attach_target(target)
    ids = torch.randint(3, 90, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, edd(ids).logits)
    again = EddForCausalLM.from_pretrained(tmp_path, target=target)
    assert again.target is target


def test_wrong_target_is_a_clear_error(tmp_path, edd):
    edd.save_pretrained(tmp_path)
    other = tiny_llama(num_hidden_layers=4, seed=5)
    with pytest.raises(SpecDecError, match="was built for target"):
        EddForCausalLM.from_pretrained(tmp_path, target=other)
    unattached = EddForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(SpecDecError, match="not attached"):
        unattached(torch.tensor([[3, 4]]))


@pytest.mark.parametrize("soft_prompt", [True, False])
def test_assisted_chain_is_lossless_greedy(target, soft_prompt):
    torch.manual_seed(2)
    edd = EddForCausalLM(EddConfig.for_target(target, soft_prompt=soft_prompt)).eval()
    edd.init_from_target(target)  # a drafter that agrees with the target often, so drafts get accepted
    for seed in range(3):
        torch.manual_seed(seed)
        ids = torch.randint(3, 90, (1, 9))
        kw = dict(max_new_tokens=25, min_new_tokens=25, do_sample=False)
        ref = target.generate(ids, **kw)
        out = target.generate(ids, assistant_model=edd, **kw)
        assert torch.equal(ref, out)


def test_assisted_chain_accepts_drafts_and_keeps_soft_prompt_verified(target):
    """With a warm-started EDD some drafts are accepted (so the drafts are really used), and the soft-prompt
    part of EDD's cache covers exactly the verified tokens."""
    from hf_specdec.core.stats import ForwardMeter
    from hf_specdec.edd.tree_proposer import EddTreeProposer

    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    edd.chain_cost = False  # all gamma drafts; no cost-timing forwards in the meter
    seen = []
    original = EddTreeProposer.propose

    def spy(self, input_ids, max_depth):
        seen.append((input_ids.shape[1], self.state.n_prefix, self.state.known()))
        return original(self, input_ids, max_depth)

    EddTreeProposer.propose = spy
    try:
        ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40]])
        with ForwardMeter(target) as meter:
            out = target.generate(
                ids, assistant_model=edd, max_new_tokens=30, min_new_tokens=30, do_sample=False
            )
    finally:
        EddTreeProposer.propose = original
    assert meter.calls < 30  # fewer target forwards than tokens: drafts were accepted
    assert out.shape[1] == ids.shape[1] + 30
    for length, n_prefix, known in seen[1:]:
        # soft prompt == verified tokens (not the bonus, not drafts); the pending ones enter the cache as it drafts
        assert known == length - 1 and n_prefix <= known, seen


def test_sampling_chain_keeps_target_distribution():
    """Speculative sampling with EDD drafts: the 2nd sampled token's distribution matches plain sampling."""
    target = tiny_llama(vocab_size=8, num_hidden_layers=4, seed=3)
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    edd.chain_cost = False  # fixed gamma: proposals independent of this machine's timings, so the run repeats
    ids = torch.tensor([[3, 5, 4, 6]])
    n = 600
    kw = dict(max_new_tokens=3, min_new_tokens=3, do_sample=True, top_k=0)
    counts = {"plain": torch.zeros(8), "edd": torch.zeros(8)}
    torch.manual_seed(0)
    for _ in range(n):
        counts["plain"][target.generate(ids, **kw)[0, -1]] += 1
        counts["edd"][target.generate(ids, assistant_model=edd, **kw)[0, -1]] += 1
    tv = 0.5 * (counts["plain"] / n - counts["edd"] / n).abs().sum().item()
    assert tv < 0.09, f"total variation {tv:.3f} between plain and EDD-assisted sampling"


def test_reduced_draft_vocab_restricts_drafts_round_trips_and_stays_lossless(tmp_path, target):
    """``set_draft_vocab`` on a (trained) EDD: logits only over the kept ids (the target's rows, unchanged), -inf
    elsewhere in full-vocabulary logits, saved and reloaded with the checkpoint, and chain / PCT decoding with it
    still equal plain greedy decoding. Bad id sets are clear errors."""
    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer

    torch.manual_seed(2)
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    edd.attach_target(target)
    ids = torch.randint(3, 90, (1, 8))
    with torch.no_grad():
        full = edd(ids).logits
    keep = torch.arange(0, 96, 2)  # every other token
    edd.set_draft_vocab(keep.flip(0))  # any order
    assert edd.config.draft_vocab_size == 48 and torch.equal(edd.draft_vocab_ids, keep)
    with torch.no_grad():
        reduced = edd(ids).logits
    torch.testing.assert_close(reduced[..., keep], full[..., keep])
    assert torch.isinf(reduced[..., 1::2]).all()
    edd.save_pretrained(tmp_path)
    loaded = EddForCausalLM.from_pretrained(tmp_path, target=target).eval()
    assert torch.equal(loaded.draft_vocab_ids, keep)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, reduced)
    kw = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False)
    ref = target.generate(ids, **kw)
    assert torch.equal(target.generate(ids, assistant_model=loaded, **kw), ref)
    proposer = EddTreeProposer(loaded, "pct", ratio=0.05)
    assert torch.equal(target.generate(ids, custom_generate=tree_generate, proposer=proposer, **kw), ref)
    assert set(proposer.last_tree.tokens) <= set(keep.tolist())
    # trees built over the draft vocabulary (columns mapped to ids) == trees over full-vocabulary probabilities
    from hf_specdec.edd.draft_state import EddDraftState
    from hf_specdec.edd.pct import grow_fixed
    from hf_specdec.edd.tree_proposer import EddTreeExpander

    class FullVocab(EddTreeExpander):
        def expand(self, nodes, tree):
            probs = super().expand(nodes, tree)
            return torch.zeros(len(nodes), 97).index_copy_(-1, keep, probs)

    trees = []
    for expander in (EddTreeExpander, FullVocab):
        state = EddDraftState(loaded)
        with torch.no_grad():
            state.push_hidden(
                target(ids[:, :-1], output_hidden_states=True).hidden_states[loaded.config.encoder_layer]
            )
            exp = expander(state, ids)
            exp.token_ids = keep if expander is EddTreeExpander else None
            grown = grow_fixed(exp, width=3, depth=2)
        trees.append((grown.tokens, grown.parents, grown.confidence))
    assert trees[0] == trees[1] and set(trees[0][0]) <= set(keep.tolist())
    for bad in ([], [3, 3], [-1, 4], [5, 10**6]):
        with pytest.raises(SpecDecError, match="draft vocabulary"):
            loaded.set_draft_vocab(bad)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.compat
def test_real_target_chain_and_pct_are_lossless(real_target):
    """On SmolLM2-135M (fp32) an EDD (warm start, untrained) chain and PCT tree give plain greedy's tokens."""
    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer

    target, tok = real_target
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about the sea."}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    ref = target.generate(**kw)
    assert torch.equal(target.generate(**kw, assistant_model=edd), ref)
    proposer = EddTreeProposer(edd, "pct")
    assert torch.equal(target.generate(**kw, custom_generate=tree_generate, proposer=proposer), ref)


@pytest.mark.real
@pytest.mark.slow
def test_shipped_checkpoint_loads_with_auto_class_and_is_lossless(real_target):
    """The trained EDD shipped in the package (reduced draft vocabulary) loads through AutoModelForCausalLM,
    belongs to the default target, and its chain and PCT outputs equal plain greedy decoding."""
    from transformers import AutoModelForCausalLM

    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer
    from hf_specdec.shipped import shipped_checkpoint

    target, tok = real_target
    packaged = shipped_checkpoint("edd", target)
    assert packaged is not None and packaged.name == "edd-smollm2"
    edd = AutoModelForCausalLM.from_pretrained(packaged).eval()
    assert isinstance(edd, EddForCausalLM) and edd.config.draft_vocab_size == len(edd.draft_vocab_ids) == 8192
    edd.attach_target(target)
    ids = tok("def fibonacci(n):\n    ", return_tensors="pt").input_ids
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    ref = target.generate(**kw)
    assert torch.equal(target.generate(**kw, assistant_model=edd), ref)
    proposer = EddTreeProposer(edd, "pct")
    assert torch.equal(target.generate(**kw, custom_generate=tree_generate, proposer=proposer), ref)
