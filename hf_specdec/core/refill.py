"""Continuous batching in the tree core's loop: rows leave a running batch when they end, new prompts join it.

Plain batched decoding runs a batch until its longest row ends, every prompt left-padded to the batch's longest: a
row that ended early keeps being computed, and a batch of prompts of very different lengths is mostly padding. Here
the loop (``tree_decoding._decode``) drops a row from the batch when it ends, as it always does, and asks a
:class:`Refill` after every forward whether new rows join: once ``refill_at`` places of ``batch_size`` are free (or
the batch is empty), the next prompts in the queue are cut into groups of similar length (:func:`prefill_groups`),
and each group is prefilled by one forward of the loop on a cache of its own, accepts its first token as every
forward does (``acceptance.accept_tree`` on an empty tree, under the same logits processors and stopping rule) and
is appended to the batch's cache (``RaggedCache.append_rows``). Each joined row has its own proposer (a shallow copy
of the given one, ``start``-ed on its row, as in a batch of ``tree_generate``) and its own length limit: its padded
prompt and ``max_new_tokens``.

Every row sees only its own entries of the shared :class:`~.ragged_cache.RaggedCache` (a 4D mask, position ids that
count its real tokens), so each row computes what it computes alone, up to float rounding. With
:class:`NoDraft` the loop is plain greedy or sampled decoding with a refilled batch (``hf-specdec corpus --method
ar-refill``); any other proposer drafts in it as in ``tree_generate``.
"""

from __future__ import annotations

import copy
from collections import deque

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from .batch_decoding import Row
from .batch_io import left_pad
from .generate_io import GenerateOutputs, StopRule
from .proposer import TreeProposer
from .ragged_cache import RaggedCache
from .sliding_window import LayerMasks, verification_cache
from .stats import DecodeStats
from .timing import untimed
from .tree import TokenTree
from .tree_decoding import _decode
from .verify_cost import CostObserver

PREFILL_WASTE = 0.25  # at most this fraction of a prefill group's tokens are padding (prefill_groups)


class NoDraft(TreeProposer):
    """Drafts nothing: every step verifies the root alone, i.e. plain decoding in the tree core's loop."""

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        return TokenTree.empty(input_ids.device)


class Refill:
    """The prompts that join the loop's batch (module docstring), in the order of ``prompts``. ``widths[i]``: the
    padded prompt width of prompt ``i`` once it has joined (its new tokens follow it in its row's ids)."""

    def __init__(
        self,
        model,
        prompts: list[list[int]],
        pad_id: int,
        max_new_tokens: int,
        batch_size: int,
        refill_at: int,
        proposer: TreeProposer,
        generation_config: GenerationConfig,
    ):
        self.model, self.prompts, self.pad_id, self.max_new_tokens = model, prompts, pad_id, max_new_tokens
        self.batch_size, self.refill_at = batch_size, refill_at
        self.proposer, self.cfg, self.masks = proposer, generation_config, LayerMasks(model)
        self.device = next(model.parameters()).device
        self.queue = deque(range(len(prompts)))  # prompts not yet grouped
        self.groups: deque[list[int]] = deque()  # groups of the last refill not yet prefilled
        self.widths: dict[int, int] = {}

    @property
    def waiting(self) -> bool:
        """Whether prompts have not joined yet."""
        return bool(self.queue or self.groups)

    def next(self, active: int) -> tuple[RaggedCache, list[Row], tuple] | None:
        """The next group to prefill, with ``active`` rows in the batch: its own cache, its rows and the prefill's
        inputs; ``None`` while the batch steps on. A refill is decided when the batch is empty or ``refill_at``
        places are free, and its groups are prefilled one per forward before the batch steps again."""
        if not self.groups and self.queue and (active == 0 or self.batch_size - active >= self.refill_at):
            new = [self.queue.popleft() for _ in range(min(self.batch_size - active, len(self.queue)))]
            self.groups += [[new[k] for k in g] for g in prefill_groups([self.prompts[i] for i in new])]
        if not self.groups:
            return None
        group = self.groups.popleft()
        ids, mask = left_pad([self.prompts[i] for i in group], self.pad_id, self.device)
        width = ids.shape[1]
        rows = []
        for b, index in enumerate(group):
            pad = width - len(self.prompts[index])
            row = Row(index, ids[b : b + 1], pad, copy.copy(self.proposer), width + self.max_new_tokens)
            row.proposer.start(self.model, row.tokens, self.cfg)
            rows.append(row)
            self.widths[index] = width
        layout = RaggedCache(verification_cache(self.model, None), self.masks)
        return layout, rows, layout.prefill(ids, mask)


@torch.no_grad()
def refill_generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    generation_config: GenerationConfig,
    stopping_criteria: StoppingCriteriaList,
    pad_id: int,
    batch_size: int,
    refill_at: int | None = None,
    proposer: TreeProposer | None = None,
    logits_processor: LogitsProcessorList | None = None,
) -> list[list[int]]:
    """Each prompt's new tokens (ending with the one that stopped it), in the order of ``prompts``, which join the
    batch in that order (sort them by length for little padding). At most ``batch_size`` rows decode at once; new
    rows join when ``refill_at`` places are free (default a quarter of ``batch_size``) or the batch is empty.
    ``proposer``: :class:`NoDraft` by default; ``stopping_criteria`` end a row (EOS ids), as does
    ``max_new_tokens``."""
    if not prompts:
        return []
    refill_at = max(1, batch_size // 4) if refill_at is None else refill_at
    proposer = proposer if proposer is not None else NoDraft()
    cfg = generation_config
    refill = Refill(model, prompts, pad_id, max_new_tokens, batch_size, refill_at, proposer, cfg)
    layout, rows, inputs = refill.next(0)
    finished = _decode(
        model,
        rows,
        layout,
        inputs,
        cfg,
        logits_processor if logits_processor is not None else LogitsProcessorList(),
        StopRule(stopping_criteria),
        GenerateOutputs(cfg, kinds=()),
        DecodeStats(),
        None,
        untimed,
        None,
        CostObserver(model, len(prompts[0]), batch_size),
        refill,
    )
    return [finished[i][0, refill.widths[i] :].tolist() for i in range(len(prompts))]


def prefill_groups(prompts: list[list[int]], waste: float = PREFILL_WASTE) -> list[list[int]]:
    """The indices of ``prompts`` cut into prefill groups of similar length: by length, a group closes before a
    prompt that would make more than ``waste`` of its tokens padding. (One prefill of 20 prompts of 100 to 850 tokens,
    padded to 850, took 87 s of a 347 s shard; docs/corpus.md.)"""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i])):
        n = len(prompts[i])
        if groups and (len(groups[-1]) + 1) * n <= (1 + waste) * (real + n):
            groups[-1].append(i)
            real += n
        else:
            groups.append([i])
            real = n
    return groups
