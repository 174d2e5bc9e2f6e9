"""A batch in the tree core: each row drafts, is verified and accepts on its own.

``tree_generate`` (and so PLD+, GLIDE + CAPE, the EDD trees and the chain drafters) takes a left-padded batch with its
``attention_mask``, as plain batched ``generate`` does, in the same loop as a single prompt
(``tree_decoding._decode``). Each step, every active row's proposer (a shallow copy of the given one per row, each
``start``-ed on its own row) drafts a tree below the row's last token; ONE target forward verifies all rows, each over
``[root, its nodes]`` padded to the longest row, with its own tree mask and position ids (``ragged_cache.py``);
acceptance runs per row on the row's logits, so rows accept different numbers of tokens; the cache keeps each row's
accepted path. A row that meets a stopping criterion (EOS, ``max_length``, stop strings) leaves the batch and stops
costing compute. Proposers see their row alone: ``input_ids`` without padding, the hidden states of their own
accepted tokens, and the target's cache as a per-row view without holes (``RowKV``).

Per row, the result is what the row alone gives (the same logits up to float rounding: the batch changes only the
shapes of the matmuls), so greedy output is the row's plain greedy output and sampling is the target's
distribution. The output has plain batched ``generate``'s layout (:func:`assemble`).

This module holds the loop's rows (:class:`Row`) and what only a batch needs: its checks (:func:`check_left_padded`,
:func:`check_batch`), the depth that pays for every row (:func:`best_depth`) and the output layout. ``stats`` (a
``DecodeStats``): ``target_forwards`` counts row-forwards (each batched forward counts once per active row), so
tau = new tokens / target forwards keeps its batch-1 meaning; ``batched_forwards`` counts the forwards. Rows may
also join a running batch (continuous batching: ``refill.py``).
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from ..errors import SpecDecError
from .generate_io import eos_token_ids
from .proposer import TreeProposer
from .tree import TokenTree
from .verify_cost import CostCurve

UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_hidden_states", "output_attentions")


class Row:
    """One row of the loop's batch: its ids ``(1, P + new)`` with ``pad`` left padding, its proposer, its tree this
    step. ``max_length``: the row's length limit, padding included (a ``generate`` call's ``max_length``, or a row
    that joined a running batch: its own)."""

    def __init__(self, index: int, ids: torch.Tensor, pad: int, proposer: TreeProposer, max_length: int):
        self.index, self.ids, self.pad, self.proposer, self.max_length = index, ids, pad, proposer, max_length
        self.tree = TokenTree.empty(ids.device)  # the prefill verifies no tree

    @property
    def tokens(self) -> torch.Tensor:
        """The row without its padding, ``(1, L)``: what the proposer and the row alone see."""
        return self.ids[:, self.pad :]


def check_left_padded(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, name: str, pad_token_id: int | None = None
) -> torch.Tensor:
    """The batch's attention mask, checked: left padding only, at least one real token per row. A batch of rows of
    equal length may come without a mask; one whose rows start with ``pad_token_id`` may not."""
    if attention_mask is None:
        if pad_token_id is not None and bool((input_ids[:, 0] == pad_token_id).any()):
            raise SpecDecError(
                f"{name}: rows of the batch start with the pad token {pad_token_id} but no attention_mask was "
                "passed; pass the tokenizer's attention_mask (tokenizer(texts, padding=True, return_tensors='pt'), "
                "padding_side='left')"
            )
        return torch.ones_like(input_ids, dtype=torch.long)
    if attention_mask.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise SpecDecError(
            f"{name}: attention_mask must be 2D like input_ids {tuple(input_ids.shape)}, got "
            f"{tuple(attention_mask.shape)}"
        )
    real = attention_mask.bool()
    if bool((real[:, :-1] & ~real[:, 1:]).any()):
        raise SpecDecError(
            f"{name} needs a LEFT-padded batch (a real token is followed by padding in attention_mask); tokenize "
            "with tokenizer.padding_side = 'left'"
        )
    if not bool(real[:, -1].all()):
        raise SpecDecError(f"{name}: a row of the batch is empty (attention_mask all zeros); drop it")
    return attention_mask


def check_batch(cfg: GenerationConfig, proposer: TreeProposer, streamer) -> None:
    """What a batch (> 1 row) cannot do here, refused with what to do: a streamer, per-token outputs, a proposer
    that reads attention maps."""
    name = "batched speculative decoding"
    if streamer is not None:
        raise SpecDecError(
            f"{name}: a streamer takes one row; stream batch-1 generations, or drop the streamer"
        )
    if cfg.return_dict_in_generate and any(getattr(cfg, o, False) for o in UNSUPPORTED_OUTPUTS):
        raise SpecDecError(
            f"{name} returns sequences only at batch size > 1 ({', '.join(UNSUPPORTED_OUTPUTS)} are batch-1 "
            "features here); generate the rows one at a time to get them"
        )
    if proposer.needs_attentions:
        raise SpecDecError(
            f"{name}: {type(proposer).__name__} reads attention maps, which this loop gives at batch size 1 only; "
            "run the rows one at a time (or use PLD+(h), pld_variant='hidden')"
        )


def best_depth(proposers: list[TreeProposer], trees: list[TokenTree], cost: CostCurve) -> int | None:
    """The depth to cut every row's tree to, maximising the batch's expected tokens per unit of time,
    ``sum_b E_b(d) / c(q(d))`` (``E_b``: the row's ``expected_tokens``, ``q(d)``: the forward's width, 1 + the
    largest cut tree; ``cost``: the batch's cost curve, ``c(1) = 1``). One row's long draft widens the forward of
    every row, so it is kept only when it pays for all of them. ``None`` when a proposer cannot tell."""
    deepest = max(t.max_depth for t in trees)
    best, best_rate = None, 0.0
    for d in range(deepest + 1):
        gains = [p.expected_tokens(d) for p in proposers]
        if any(g is None for g in gains):
            return None
        width = 1 + max(sum(1 for x in t.depths if x <= d) for t in trees)
        rate = sum(gains) / cost(width)
        if rate > best_rate:
            best, best_rate = d, rate
    return best


def assemble(
    input_ids: torch.Tensor, finished: dict[int, torch.Tensor], cfg: GenerationConfig
) -> torch.Tensor:
    """Plain batched ``generate``'s layout: the padded prompt, then each row's new tokens, padded with the pad id
    (else the first EOS id, else 0)."""
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (eos_token_ids(cfg) or [0])[0]
    width = max(ids.shape[1] for ids in finished.values())
    out = input_ids.new_full((input_ids.shape[0], width), int(pad_id))
    for b, ids in finished.items():
        out[b, : ids.shape[1]] = ids[0]
    return out
