"""The step costs its forwards: greedy acceptance in tensors, host syncs per step, the bench's split."""

from __future__ import annotations

import random

import torch
from transformers import LogitsProcessorList

from hf_specdec.core.acceptance import accept_greedy, accept_tree
from hf_specdec.core.host_syncs import HostSyncCounter
from hf_specdec.core.proposer import TreeProposer
from hf_specdec.core.stats import DecodeStats, ForwardMeter
from hf_specdec.core.tree import ROOT, TokenTree
from hf_specdec.core.tree_decoding import tree_generate

from .conftest import tiny_llama


class _Identity:
    """A logits processor that changes nothing: it sends ``accept_tree`` down the node-by-node walk."""

    def __call__(self, input_ids, scores):
        return scores


def _random_tree(rng: random.Random, n: int, vocab: int) -> TokenTree:
    tokens, parents, used = [], [], set()
    for i in range(n):
        while True:  # siblings carry distinct tokens, as every proposer's do (the root has < vocab children)
            parent = rng.choice([ROOT, *range(i)])
            free = [t for t in range(vocab) if (parent, t) not in used]
            if free:
                break
        token = rng.choice(free)
        used.add((parent, token))
        tokens.append(token)
        parents.append(parent)
    return TokenTree(tokens, parents)


def test_tensor_greedy_acceptance_matches_the_walk_on_random_trees():
    rng, vocab = random.Random(0), 5  # a small vocabulary, so many nodes match
    ids = torch.tensor([[1, 2, 3]])
    accepted = 0
    for trial in range(300):
        tree = _random_tree(rng, rng.randrange(0, 12), vocab)
        logits = torch.randn(1 + len(tree), vocab, generator=torch.Generator().manual_seed(trial))
        walk = accept_tree(tree, logits, ids, LogitsProcessorList([_Identity()]))
        fast = accept_greedy(tree, logits)
        assert (fast.nodes, fast.tokens) == (walk.nodes, walk.tokens), trial
        assert all(torch.equal(a, b) for a, b in zip(fast.scores, walk.scores))
        accepted += len(fast.nodes)
    assert accepted > 50  # the trees were really walked, not just rejected at the root


class _FixedChain(TreeProposer):
    """Proposes the same host-built chain every step: no drafting reads, so what is counted is the loop's own."""

    def propose(self, input_ids, max_depth):
        return TokenTree.from_chain([5, 6, 7][:max_depth], device=input_ids.device)


def test_greedy_tree_step_reads_the_device_once():
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(0))
    reference = model.generate(prompt, max_new_tokens=20, do_sample=False)
    model.generation_config.max_length = prompt.shape[1] + 20
    with HostSyncCounter() as syncs, ForwardMeter(model) as meter:
        meter.syncs = syncs
        out = tree_generate(model, prompt, proposer=_FixedChain(), generation_config=model.generation_config)
    assert torch.equal(out, reference)
    # one read per step (the acceptance), none in the compaction, the stopping check or the tree's set-up; the
    # generation's set-up reads its EOS ids and the stopping criteria's once
    assert syncs.total <= meter.calls + 2, syncs.by_kind


def test_host_sync_counter_sees_every_kind_of_read_and_pauses():
    x = torch.arange(4)
    with HostSyncCounter() as syncs:
        x.tolist(), int(x[0]), float(x[1]), bool(x[2] > 0), x[3].item(), x.cpu(), [0, 1][x[1]]
        with syncs.paused():
            x.tolist()
    assert syncs.total == 7
    assert torch.Tensor.__dict__.get("tolist") is None  # restored


def test_planted_per_token_read_is_counted():
    """A loop that reads the device once per emitted token (the old stopping check) is caught by the count."""
    model = tiny_llama()
    prompt = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(1))
    model.generation_config.max_length = prompt.shape[1] + 12

    class Reading(_FixedChain):
        def observe(self, feedback):
            for t in feedback.input_ids[0, -len(feedback.new_tokens) :]:
                int(t)  # a planted read per emitted token

    with HostSyncCounter() as syncs, ForwardMeter(model) as meter:
        meter.syncs = syncs
        out = tree_generate(model, prompt, proposer=Reading(), generation_config=model.generation_config)
    assert syncs.total >= out.shape[1] - prompt.shape[1] + meter.calls - 1


def test_bench_split_adds_up_and_reads_the_drafter():
    from hf_specdec.bench.figures import step_split

    records = [
        dict(forwards=4, target_time=0.4, drafter_time=0.04, total_time=0.48, one_token_forward=0.1),
        dict(forwards=6, target_time=0.6, drafter_time=0.06, total_time=0.72, one_token_forward=0.1),
    ]
    s = step_split(records, 0.1, [(8, 4)])
    assert s["steps"] == 10 and s["target_ms"] == 100.0 and s["drafter_ms"] == 10.0
    assert abs(s["overhead_ms"] - 10.0) < 1e-6 and abs(s["overhead_fwd"] - 0.1) < 1e-6
    assert s["syncs_per_step"] == 2.0


def test_drafter_meter_times_the_drafter_and_restores_it():
    from hf_specdec.core.stats import DrafterMeter

    class Drafter(torch.nn.Module):
        def hidden_states(self, x):
            return self.draft_logits(x)  # nested: counted once

        def draft_logits(self, x):
            return x + 1

    d = Drafter()
    d.w = torch.nn.Parameter(torch.zeros(1))
    with DrafterMeter(d) as meter:
        d.hidden_states(torch.zeros(2))
        d.draft_logits(torch.zeros(2))
    assert meter.calls == 2 and meter.time > 0
    assert "hidden_states" not in d.__dict__ and "draft_logits" not in d.__dict__
    stats = DecodeStats()
    assert stats.host_syncs is None


def test_space_greedy_step_reads_the_device_at_most_twice():
    """SPACE's greedy step (<= 2 host syncs per step): the acceptance and the next candidates, one read
    each; the sequence and the verified chain stay on the host (the step read them back before)."""
    from hf_specdec.space.decoding import space_generate

    model = tiny_llama()
    model.config.space_k, model.config.space_mask_token_id = 2, 96
    prompt = torch.randint(3, 96, (1, 8), generator=torch.Generator().manual_seed(2))
    reference = model.generate(prompt, max_new_tokens=20, do_sample=False)
    model.generation_config.max_length = prompt.shape[1] + 20
    stats = DecodeStats()
    with HostSyncCounter() as syncs, ForwardMeter(model) as meter:
        meter.syncs = syncs
        out = space_generate(
            model, prompt, generation_config=model.generation_config, stats=stats, space_cost=False
        )
    assert torch.equal(out, reference) and stats.drafted > 0  # candidates were verified on the way
    assert syncs.total <= 2 * meter.calls + 3, (
        syncs.by_kind
    )  # + set-up: the prompt, EOS ids, stopping criteria
