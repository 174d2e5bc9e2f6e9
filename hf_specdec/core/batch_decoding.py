"""Tree speculative decoding over a batch: each row drafts, is verified and accepts on its own (issue #17).

``tree_generate`` (and so PLD+, GLIDE + CAPE, the EDD trees and the chain drafters) comes here when ``input_ids``
has more than one row. The batch is left-padded with its ``attention_mask``, as for plain batched ``generate``.

Each step, every active row's proposer (a shallow copy of the given one per row, each ``start``-ed on its own row)
drafts a tree below the row's last token; ONE target forward verifies all rows, each over ``[root, its nodes]``
padded to the longest row, with its own tree mask and position ids (``ragged_cache.py``); acceptance
(``acceptance.py``) runs per row on the row's logits, so rows accept different numbers of tokens; the cache keeps
each row's accepted path. A row that meets a stopping criterion (EOS, ``max_length``, stop strings) leaves the batch
and stops costing compute. Proposers see their row alone: ``input_ids`` without padding, the hidden states of their
own accepted tokens, and the target's cache as a per-row view without holes (``RowKV``).

Per row, the result is what the row alone gives (the same logits up to float rounding: the batch changes only the
shapes of the matmuls), so greedy output is the row's plain greedy output and sampling is the target's
distribution. The output has plain batched ``generate``'s layout: the left-padded prompt, then each row's new
tokens, rows that stopped early filled with ``pad_token_id``.

``stats`` (a ``DecodeStats``): ``target_forwards`` counts row-forwards (each batched forward counts once per active
row), so tau = new tokens / target forwards keeps its batch-1 meaning; ``batched_forwards`` counts the forwards.
"""

from __future__ import annotations

import copy

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..errors import SpecDecError
from .acceptance import accept_tree
from .generate_io import NO_MAX_LENGTH, StopRule, eos_token_ids, logits_to_keep
from .proposer import StepFeedback, TreeProposer
from .ragged_cache import REPACK_FRACTION, RaggedCache
from .sliding_window import LayerMasks
from .stats import DecodeStats
from .timing import clock
from .tree import TokenTree
from .verify_cost import CostCurve

UNSUPPORTED_OUTPUTS = ("output_scores", "output_logits", "output_hidden_states", "output_attentions")


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


class _Row:
    """One batch row: its padded ids ``(1, P + new)``, padding ``pad``, proposer and tree of this step."""

    def __init__(self, index: int, ids: torch.Tensor, pad: int, proposer):
        self.index, self.ids, self.pad, self.proposer = index, ids, pad, proposer
        self.tree: TokenTree | None = None

    @property
    def tokens(self) -> torch.Tensor:
        """The row without its padding, ``(1, L)``: what the proposer and the row alone see."""
        return self.ids[:, self.pad :]


@torch.no_grad()
def batched_tree_generate(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    cfg: GenerationConfig,
    proposer: TreeProposer,
    stats: DecodeStats,
    cache,
    streamer=None,
    repack_fraction: float = REPACK_FRACTION,
    batch_cost: CostCurve | None = None,
) -> torch.LongTensor:
    """The batched loop (module docstring); ``tree_generate`` checks the model and builds the arguments."""
    device = input_ids.device
    t_start = clock(device)
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
    mask = check_left_padded(input_ids, attention_mask, name, cfg.pad_token_id)
    ragged = RaggedCache(cache)
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (eos_token_ids(cfg) or [0])[0]
    max_length = cfg.max_length if cfg.max_length is not None else NO_MAX_LENGTH
    do_sample = bool(cfg.do_sample)
    need_hidden = proposer.needs_hidden_states
    stop = StopRule(stopping_criteria)
    pads = (mask == 0).sum(1).tolist()

    t0 = clock(device)
    proposer.start(
        model, input_ids[:1, pads[0] :], cfg
    )  # one-time set-up (calibration...) on the given proposer
    rows = []
    for b in range(input_ids.shape[0]):
        row_proposer = copy.copy(proposer)
        row = _Row(b, input_ids[b : b + 1], pads[b], row_proposer)
        row_proposer.start(model, row.tokens, cfg)
        rows.append(row)
    stats.draft_time += clock(device) - t0
    finished_ids: dict[int, torch.Tensor] = {}

    masks = LayerMasks(model)  # the masks per layer type (sliding windows count positions, not holes)
    positions, bool_mask = ragged.prefill_inputs(mask)
    key_positions = positions
    fed, roots_at, is_prefill = input_ids, [input_ids.shape[1] - 1] * len(rows), True
    draft_s = 0.0
    while rows:
        t0 = clock(device)
        out = model(
            input_ids=fed,
            position_ids=positions,
            attention_mask=masks(bool_mask, positions, key_positions),
            past_key_values=ragged.cache,
            use_cache=True,
            output_hidden_states=need_hidden,
            return_dict=True,
            **logits_to_keep(model, fed.shape[1] - min(roots_at)),
        )
        verify_s = clock(device) - t0
        logits = out.logits.to(torch.float32)
        first_row = fed.shape[1] - logits.shape[1]  # fed index of logits row 0
        offsets, emitted, results = [], 0, []
        for i, row in enumerate(rows):
            tree = row.tree if row.tree is not None else TokenTree.empty(device)
            n, r = len(tree), roots_at[i]
            row_logits = logits[i, r - first_row : r - first_row + 1 + n]
            tree.check_vocab(row_logits.shape[-1])
            acc = accept_tree(tree, row_logits, row.ids, logits_processor, do_sample)
            before = row.ids.shape[1]
            row.ids, done = stop.append(row.ids, acc.tokens)
            m = row.ids.shape[1] - before  # tokens emitted (stopping criteria may cut the path short)
            # fed rows that stay: those up to the root (the prompt at the prefill, r = 0 after), the accepted nodes
            kept = [*range(r + 1), *(r + 1 + c for c in acc.nodes[: m - 1])]
            offsets.append(kept)
            emitted += m
            results.append((acc, m, done, kept))
            stats.drafted += n
            stats.accepted += m - 1
        if not is_prefill:
            ragged.keep(offsets)
        stats.target_forwards += len(rows)
        stats.batched_forwards += 1
        stats.verify_time += verify_s
        stats.draft_time += draft_s
        stats.new_tokens += emitted
        stats.steps.append(
            dict(rows=len(rows), fed=fed.shape[1], new_tokens=emitted, draft_s=draft_s, verify_s=verify_s)
        )

        hidden = out.hidden_states if need_hidden else None
        layers = rows[0].proposer.hidden_layers  # every row's proposer reads the same layers
        del out
        survivors, feedback = [], []
        for i, (row, (acc, m, done, kept)) in enumerate(zip(rows, results)):
            if done or row.ids.shape[1] >= max_length:
                finished_ids[row.index] = row.ids
                continue
            survivors.append(i)
            real = [k for k in kept if not is_prefill or k >= row.pad]
            row_hidden = None
            if hidden is not None:
                idx = torch.tensor(real, device=hidden[0].device)
                row_hidden = tuple(
                    h[i : i + 1].index_select(1, idx) if layers is None or k in layers else None
                    for k, h in enumerate(hidden)
                )
            feedback.append((row, acc, m, row_hidden))
        if not survivors:
            break
        if len(survivors) < len(rows):
            ragged.select_rows(torch.tensor(survivors, device=device))
        rows = [rows[i] for i in survivors]
        if ragged.holes() > repack_fraction:
            ragged.repack()
        t0 = clock(device)
        for j, (row, acc, m, row_hidden) in enumerate(feedback):
            row.proposer.observe(
                StepFeedback(
                    row.tokens,
                    acc.tokens[:m],
                    m - 1,
                    acc.nodes[: m - 1],
                    None if is_prefill else row.tree,
                    ragged.row_view(j),
                    row_hidden,
                    None,
                    is_prefill,
                )
            )
            budget = max_length - row.ids.shape[1] - 1
            tree = row.proposer.propose(row.tokens, budget).truncate_depth(max(budget, 0))
            tree.tokens = tree.tokens.to(device)
            row.tree = tree
        if batch_cost is not None and len(rows) > 1:
            depth = best_depth([row.proposer for row in rows], [row.tree for row in rows], batch_cost)
            if depth is not None:
                for row in rows:
                    row.tree = row.tree.truncate_depth(depth)
        draft_s = clock(device) - t0
        is_prefill = False
        roots = torch.cat([row.ids[:, -1] for row in rows])
        fed, positions, bool_mask = ragged.tree_inputs([row.tree for row in rows], roots)
        key_positions = torch.cat([ragged.entry_positions(), positions], dim=1)
        roots_at = [0] * len(rows)

    stats.total_time += clock(device) - t_start
    return _assemble(input_ids, finished_ids, pad_id)


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


def _assemble(input_ids: torch.Tensor, finished: dict[int, torch.Tensor], pad_id: int) -> torch.Tensor:
    """Plain batched ``generate``'s layout: the padded prompt, then each row's new tokens, padded with ``pad_id``."""
    width = max(ids.shape[1] for ids in finished.values())
    out = input_ids.new_full((input_ids.shape[0], width), int(pad_id))
    for b, ids in finished.items():
        out[b, : ids.shape[1]] = ids[0]
    return out
