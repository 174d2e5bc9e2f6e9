"""Shared fixtures: tiny random-weight models for logic, the real default target for end-to-end truth."""

from __future__ import annotations

import os

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# every test measures the costs it needs: none is read from costs stored by earlier runs (core/cost_store.py)
os.environ["HF_SPECDEC_COST_STORE"] = "off"


def pytest_configure(config):
    """Under ``pytest -n N`` (pytest-xdist, what ``make test`` runs) each worker gets its share of the CPU's cores,
    and so do the processes it starts (``OMP_NUM_THREADS``): N processes of all cores each slow each other far
    more than N-fold on a 2-core machine."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


class CollectStreamer(BaseStreamer):
    """A streamer that keeps every chunk it is given (as a list of ids) and whether it was ended."""

    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True

    def follows(self, prompt: torch.Tensor, output: torch.Tensor) -> bool:
        """The prompt first, then exactly the new tokens of ``output``, then ``end()``."""
        new = output[0, prompt.shape[1] :].tolist()
        return self.ended and self.chunks[0] == prompt[0].tolist() and sum(self.chunks[1:], []) == new


def tiny_llama(vocab_size: int = 97, seed: int = 0, **overrides):
    """A 2-layer Llama with GQA (4 query heads over 2 KV heads) and random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def tiny_gpt2(vocab_size: int = 97, seed: int = 0):
    """A second architecture (learned absolute positions, fused QKV, no GQA) with random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=512, bos_token_id=1, eos_token_id=2
    )
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def real_target():
    """(model, tokenizer) of the embedded default target in fp32; converted once per machine."""
    from hf_specdec import load_default_target

    return load_default_target("fp32")


@pytest.fixture(scope="session")
def gguf_copy(tmp_path_factory):
    """``(home, copy)``: a copy of the default target's GGUF at a temporary path (``models/my-model.gguf``) and an
    ``HF_SPECDEC_HOME`` for its conversion, shared by the tests of this session so it is converted once. Tests set
    ``HF_SPECDEC_HOME`` to ``home`` themselves (monkeypatch)."""
    import shutil

    from hf_specdec.target import DEFAULT_TARGET_GGUF, _gguf_folder

    root = tmp_path_factory.mktemp("gguf")
    (root / "models").mkdir()
    copy = root / "models" / "my-model.gguf"
    shutil.copy(_gguf_folder() / DEFAULT_TARGET_GGUF, copy)
    return root / "home", copy


@pytest.fixture(scope="module")
def target_and_edd():
    """A tiny Llama target and an EDD drafter for it, initialised from the target (untrained)."""
    from hf_specdec.modeling import EddConfig, EddForCausalLM

    target = tiny_llama(num_hidden_layers=4)
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    edd.init_from_target(target)
    return target, edd


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run far faster on one thread on a shared CPU; restored after the module that asks for it
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_pairs_follow_target(counts: torch.Tensor, prompt: torch.Tensor, p) -> None:
    """``counts[x2, x3]``: how often sampling after ``prompt`` (token x1 from the prefill) produced x2, x3. Checks
    it against the target's joint ``P(x2, x3) = sum_x1 p(x1) p(x2 | x1) p(x3 | x1, x2)`` (``p(ids)``: the processed
    next-token distribution): no impossible pair, and a chi-square p-value above 1e-3."""
    stats = pytest.importorskip("scipy.stats")
    vocab, n = counts.shape[0], counts.sum()
    expected = torch.zeros(vocab, vocab)
    for a, pa in enumerate(p(prompt).tolist()):
        if pa > 0:
            ids = torch.cat([prompt, torch.tensor([[a]])], 1)
            p2 = p(ids)
            expected += pa * torch.stack(
                [p2[b] * p(torch.cat([ids, torch.tensor([[b]])], 1)) for b in range(vocab)]
            )
    keep = expected.flatten() > 0
    assert counts.flatten()[~keep].sum() == 0
    obs, exp = counts.flatten()[keep].double(), expected.flatten()[keep].double()
    assert stats.chisquare(obs.numpy(), (exp * n / exp.sum()).numpy()).pvalue > 1e-3


def warped_next_token(model, temperature: float, top_k: int):
    """``p(ids)``: ``model``'s next-token distribution after ``ids`` at ``temperature`` and ``top_k`` (the target
    distribution the sampling tests compare against)."""

    @torch.no_grad()
    def p(ids):
        logits = model(ids).logits[0, -1] / temperature
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
        return torch.softmax(logits, -1)

    return p


def left_pad(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of 1-D prompts and its attention mask (``core/batch_io.left_pad``)."""
    from hf_specdec.core.batch_io import left_pad as batch_left_pad

    return batch_left_pad([p.tolist() for p in prompts], pad)


def batch_pair_counts(model, prompts: list[torch.Tensor], runs: int, vocab: int, **generate_kwargs) -> list:
    """Sample 3 new tokens for a left-padded batch of ``prompts`` ``runs`` times (``do_sample=True`` and
    ``generate_kwargs``); per row, ``counts[x2, x3]`` of its last two tokens (for :func:`assert_pairs_follow_target`)."""
    ids, mask = left_pad(prompts)
    counts = [torch.zeros(vocab, vocab) for _ in prompts]
    for _ in range(runs):
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=3,
            do_sample=True,
            top_p=1.0,
            pad_token_id=0,
            **generate_kwargs,
        )
        for i in range(len(prompts)):
            counts[i][out[i, -2], out[i, -1]] += 1
    return counts
