"""The chain drafters take a batch: ``target.generate(**batch, assistant_model=drafter)`` with a GLIDE,
vanilla or EDD drafter runs the batched tree loop (``core/assisted.py``): every row equals that row alone, rows end on
their own, a batch of one stays in transformers' assisted loop, sampling follows the target per row; and the shipped
drafters on the real target (with ``glide_cape`` and the PCT tree) equal each row alone in fp32."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideForCausalLM

import hf_specdec
from hf_specdec.core.assisted import batch_stats
from hf_specdec.edd.tree_proposer import EddTreeProposer
from hf_specdec.errors import SpecDecError
from hf_specdec.glide.cape import CapeProposer
from hf_specdec.glide.expansion import CHAIN

from .conftest import assert_pairs_follow_target, batch_pair_counts, left_pad, tiny_llama, warped_next_token
from .test_batching import prompts_of
from .test_glide_model import _drafter

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ("glide", "vanilla", "edd")


def _edd(target) -> EddForCausalLM:
    torch.manual_seed(0)
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    return edd


def target_and_drafter(kind: str, **target_kw):
    """A tiny target and a random-weight drafter of ``kind`` attached to it (EDD: a 4-layer target)."""
    if kind == "edd":
        target = tiny_llama(num_hidden_layers=4, **target_kw)
        return target, _edd(target)
    target = tiny_llama(**target_kw)
    return target, _drafter(target, cross_attention=kind == "glide")


def alone(model, prompt: torch.Tensor, n: int, **kw) -> list[int]:
    return model.generate(prompt[None], max_new_tokens=n, do_sample=False, **kw)[0].tolist()


def rows_of(out: torch.Tensor, ids: torch.Tensor, prompts) -> list[list[int]]:
    return [out[i, ids.shape[1] - len(p) :].tolist() for i, p in enumerate(prompts)]


@pytest.mark.parametrize("kind", KINDS)
def test_each_row_equals_the_row_alone(kind, monkeypatch):
    """Three rows of different lengths: each row's output is its plain greedy output; the drafts are the drafter's
    chain of gamma tokens (one node per depth), and the batch's stats come through ``batch_stats``."""
    target, drafter = target_and_drafter(kind)
    drafter.generation_config.num_assistant_tokens, drafter.chain_cost = 3, False  # gamma every step
    proposer_class = EddTreeProposer if kind == "edd" else CapeProposer
    trees, original = [], proposer_class.propose

    def spy(self, input_ids, max_depth):
        trees.append(original(self, input_ids, max_depth))
        return trees[-1]

    monkeypatch.setattr(proposer_class, "propose", spy)
    prompts = prompts_of((5, 11, 3))
    refs = [alone(target, p, 20) for p in prompts]
    ids, mask = left_pad(prompts)
    with batch_stats() as stats:
        out = target.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
            assistant_model=drafter,
        )
    assert out.shape == (3, ids.shape[1] + 20)
    assert rows_of(out, ids, prompts) == refs
    assert stats.new_tokens == 3 * 20 and 0 < stats.batched_forwards < stats.target_forwards
    assert stats.drafted == sum(len(t) for t in trees) > 0
    assert max(len(t) for t in trees) == 3  # gamma
    assert all(t.parents.tolist() == list(range(-1, len(t) - 1)) for t in trees)  # chains


def test_make_tree_proposer_is_the_chain():
    """The chain: CAPE without expansion sets (GLIDE) or a width-1 PCT (EDD), sized by the one cost rule while
    ``chain_cost`` is on; gamma tokens every step (no budget) when it is off."""
    target, glide = target_and_drafter("glide")
    ids = torch.tensor([[1, 5, 6, 7]])
    proposer = glide.make_tree_proposer(
        target=target, generation_config=target.generation_config, input_ids=ids
    )
    assert isinstance(proposer, CapeProposer) and proposer.expansion == CHAIN and proposer.budget is not None
    assert proposer.gamma == 5  # the drafter's num_assistant_tokens (DEFAULT_GAMMA)
    glide.chain_cost = False
    proposer = glide.make_tree_proposer(
        target=target, generation_config=target.generation_config, input_ids=ids
    )
    assert proposer.budget is None
    target, edd = target_and_drafter("edd")
    edd.generation_config.num_assistant_tokens = 4
    proposer = edd.make_tree_proposer(target=target, generation_config=target.generation_config)
    assert isinstance(proposer, EddTreeProposer) and (proposer.builder, proposer.width, proposer.depth) == (
        "pct",
        1,
        4,
    )
    edd.chain_cost = False
    proposer = edd.make_tree_proposer(target=target, generation_config=target.generation_config)
    assert (proposer.builder, proposer.depth) == ("chain", 4)


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_that_ends_early(kind):
    """Row 0 meets EOS after a few tokens: it leaves the batch, is padded like plain batched generate pads it, and
    the other rows go on to their own ends."""
    target, drafter = target_and_drafter(kind)
    prompts = prompts_of((5, 7, 4), seed=2)
    free = [alone(target, p, 16) for p in prompts]
    eos = free[0][len(prompts[0]) + 2]  # row 0's third new token ends it
    refs = [alone(target, p, 16, eos_token_id=eos, pad_token_id=0) for p in prompts]
    assert len(refs[0]) <= len(prompts[0]) + 3 and max(len(r) for r in refs) > len(refs[0])
    ids, mask = left_pad(prompts)
    kw = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=eos, pad_token_id=0)
    with batch_stats() as stats:
        out = target.generate(ids, assistant_model=drafter, **kw)
    assert out.shape == target.generate(ids, **kw).shape
    for row, ref in zip(rows_of(out, ids, prompts), refs):
        assert row[: len(ref)] == ref and set(row[len(ref) :]) <= {0}
    assert stats.steps[-1]["rows"] < len(prompts)  # the finished row stopped costing compute


@pytest.mark.parametrize("kind", ("glide", "edd"))
def test_a_batch_of_one_runs_the_tree_core_loop(kind):
    target, drafter = target_and_drafter(kind)
    prompt = prompts_of((7,))[0]
    with batch_stats() as stats:
        out = target.generate(prompt[None], max_new_tokens=12, do_sample=False, assistant_model=drafter)
    assert out[0].tolist() == alone(target, prompt, 12)
    assert stats.batched_forwards > 0 and stats.new_tokens == 12


def test_batch_errors_are_clear():
    target, glide = target_and_drafter("glide")
    ids, mask = left_pad(prompts_of((3, 6)))
    kw = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0, assistant_model=glide)
    with pytest.raises(SpecDecError, match="prompt_lookup_num_tokens"):
        target.generate(ids, prompt_lookup_num_tokens=2, **kw)
    with pytest.raises(SpecDecError, match="sequences only"):
        target.generate(ids, return_dict_in_generate=True, output_scores=True, **kw)
    with pytest.raises(SpecDecError, match="LEFT-padded"):
        target.generate(ids.flip(1), **{**kw, "attention_mask": mask.flip(1)})


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_at_top_k_1_is_each_rows_greedy_output(kind):
    """Sampling runs at batch size > 1 (speculative sampling of the deterministic drafts per row); with top_k=1 the
    target's distribution is one token, so every row is its greedy output alone."""
    target, drafter = target_and_drafter(kind)
    prompts = prompts_of((4, 9, 6), seed=5)
    refs = [alone(target, p, 12) for p in prompts]
    ids, mask = left_pad(prompts)
    out = target.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=True,
        top_k=1,
        temperature=0.7,
        pad_token_id=0,
        assistant_model=drafter,
    )
    assert rows_of(out, ids, prompts) == refs


def test_sampling_follows_the_target_per_row():
    """Two rows of different prompt lengths, sampled with temperature and top-k through GLIDE's chain: each row's
    tokens 2-3 follow the target's joint distribution after that row's prompt."""
    pytest.importorskip("scipy.stats")
    vocab = 6
    target, drafter = target_and_drafter(
        "glide", vocab_size=vocab, seed=3, bos_token_id=None, eos_token_id=None, pad_token_id=None
    )
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
    prompts = [torch.tensor([1, 4, 2]), torch.tensor([3, 5, 0, 2, 1])]
    temp, top_k = 0.8, 4

    p = warped_next_token(target, temp, top_k)

    torch.manual_seed(0)
    with batch_stats() as stats:
        counts = batch_pair_counts(
            target, prompts, 400, vocab, temperature=temp, top_k=top_k, assistant_model=drafter
        )
    assert stats.accepted > 0  # drafts were accepted (the check is not plain sampling)
    for i, prompt in enumerate(prompts):
        assert_pairs_follow_target(counts[i], prompt[None], p)


# ------------------------------------------------------------------ the shipped drafters on the real target
CHAT = (
    "What is the capital of France?",
    "Write a Python function that reverses a string, and explain how it works in two sentences.",
    "Hi!",
)


@pytest.mark.real
def test_real_target_batches_equal_each_row_alone(real_target):
    """A batch of three chat prompts of different lengths (fp32): ``assistant_model=`` GLIDE and EDD, ``glide_cape``
    and the EDD PCT tree each give every row its plain greedy output alone."""
    from hf_specdec.shipped import shipped_checkpoint

    model, tok = real_target
    glide = GlideForCausalLM.from_pretrained(
        shipped_checkpoint("glide", model), target=model, dtype=model.dtype
    ).eval()
    edd = EddForCausalLM.from_pretrained(
        shipped_checkpoint("edd", model), target=model, dtype=model.dtype
    ).eval()
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"][0]
        for text in CHAT
    ]
    assert len({len(p) for p in prompts}) == 3
    n, pad = 24, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    refs = [model.generate(p[None], attention_mask=torch.ones(1, len(p)), max_new_tokens=n, do_sample=False)
            for p in prompts]  # fmt: skip
    ids, mask = left_pad(prompts, pad)
    kw = dict(attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=pad)
    runs = {
        "assistant_model=GLIDE": dict(assistant_model=glide),
        "assistant_model=EDD": dict(assistant_model=edd),
        "glide_cape": dict(custom_generate=hf_specdec.glide_cape, drafter=glide, cape_cost=False),
        "edd-pct": dict(custom_generate=hf_specdec.tree_generate, proposer=EddTreeProposer(edd, "pct")),
    }
    for name, extra in runs.items():
        with batch_stats() as stats:
            out = model.generate(ids, **kw, **extra)
        for i, (p, ref) in enumerate(zip(prompts, refs)):
            row = out[i, ids.shape[1] - len(p) :]
            new = ref[0, len(p) :].tolist()
            assert row[: len(p)].tolist() == p.tolist()
            assert row[len(p) : len(p) + len(new)].tolist() == new, (name, i)
        if name.startswith("assistant_model"):
            assert stats.accepted > 0, name
