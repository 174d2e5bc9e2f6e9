"""Tree speculative decoding as a ``generate(custom_generate=...)`` loop, with a pluggable tree proposer.

Usage::

    from hf_specdec.core.tree_decoding import tree_generate
    out = target.generate(**inputs, custom_generate=tree_generate, proposer=my_proposer, stats=DecodeStats())

Each step: the proposer drafts a :class:`~hf_specdec.core.tree.TokenTree` below the last committed token (the
root); ONE target forward verifies ``[root, nodes...]`` with tree positions and a tree mask (``tree.py``);
``acceptance.py`` picks the accepted path plus one target token (greedy or lossless sampling); the cache keeps that
path. tau (tokens per target forward) is ``1 + accepted`` per step. The prefill is the same verification with the
prompt fed and no tree below its last token. Decoder-only models, ``sdpa`` or ``eager`` attention.

One loop (:func:`_decode`) serves every batch size: a batch of one is a batch whose only row keeps its cache in
sequence order (``kv_cache.PackedCache``: compaction by one gather per layer, a caller's cache and its sliding-window
layers, every ``generate`` output); a left-padded batch (with its ``attention_mask``) keeps ragged rows
(``ragged_cache.RaggedCache``), each row drafting, being verified in the same forward and accepting on its own
(``batch_decoding.py``: the batch's checks, depth cut and output layout), and may take new rows as others end
(continuous batching, ``refill.py``). Pass a streamer as ``specdec_streamer=``
(``generate`` does not forward its own ``streamer=`` to a ``custom_generate`` callable; ``generate_io.py``).
"""

from __future__ import annotations

import copy
import logging

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..errors import SpecDecError
from ..hf_compat import CACHE_ARGUMENT, cache_of
from .acceptance import accept_tree
from .batch_decoding import Row, assemble, best_depth, check_batch, check_left_padded
from .gather import add_states, gather_attentions, gather_hidden
from .generate_io import (
    NO_MAX_LENGTH,
    GenerateOutputs,
    StopRule,
    check_generation_mode,
    check_inputs,
    finish,
    logits_to_keep,
    prepare_cache,
    resolve_streamer,
    stopping_criteria_or_default,
)
from .kv_cache import PackedCache
from .proposer import StepFeedback, TreeProposer
from .ragged_cache import RaggedCache
from .sliding_window import LayerMasks, verification_cache
from .stats import DecodeStats
from .timing import clock, untimed
from .tree import TokenTree, host_to_device
from .verify_cost import CostObserver

__all__ = ["StepFeedback", "TreeProposer", "tree_generate"]  # the proposer interface lives in proposer.py

logger = logging.getLogger(__name__)


@torch.no_grad()
def tree_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    synced_gpus: bool = False,
    streamer=None,
    proposer: TreeProposer | None = None,
    stats: DecodeStats | None = None,
    specdec_streamer=None,
    tree_streamer=None,
    batch_cost=None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """``custom_generate`` loop: propose a tree, verify it in one forward, accept, compact, repeat.

    Returns what ``generate`` returns (``sequences`` tensor, or a ``GenerateDecoderOnlyOutput`` with
    ``return_dict_in_generate=True``: scores / logits / hidden_states / attentions one entry per new token,
    as ``_sample`` does, at batch size 1). ``stats``, if given, is filled with per-step numbers
    (``DecodeStats.steps``). ``tree_streamer`` is the deprecated name of ``specdec_streamer``. ``batch_cost``: a
    batch's verification cost curve (``verify_cost.measured_cost(..., batch=B)``); with it the trees of a batch are
    cut to the depth that pays for the whole batch (``batch_decoding.best_depth``).
    """
    device = input_ids.device  # the model's (check_inputs); timed regions wait for it (core/timing.py)
    tick = clock if stats is not None else untimed  # no device sync for timings nobody asked for
    t_start = tick(device)
    if proposer is None:
        raise SpecDecError(
            "tree_generate needs a proposer: generate(..., custom_generate=tree_generate, proposer=...)"
        )
    cfg = generation_config or model.generation_config
    check_generation_mode(cfg, "tree decoding")
    check_inputs(model, input_ids, model_kwargs, synced_gpus, "tree decoding", batch=True)
    if model_kwargs.get("use_cache") is False:
        raise SpecDecError("tree decoding needs the KV cache; do not pass use_cache=False")
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    stopping_criteria = stopping_criteria_or_default(stopping_criteria, cfg)
    stats = stats if stats is not None else DecodeStats()
    masks = LayerMasks(model)  # the masks per layer type (sliding windows)
    # a batch of one keeps the sequence in order in its cache (kv_cache.PackedCache); a padded row is a batch's
    mask = model_kwargs.get("attention_mask")
    padded = mask is not None and mask.dim() == 2 and not bool(mask.all())  # read once, before the loop
    if input_ids.shape[0] == 1 and not padded:
        streamer = resolve_streamer(input_ids, streamer, specdec_streamer, tree_streamer=tree_streamer)
        cache, past = prepare_cache(model, input_ids, model_kwargs)
        layout, pads = PackedCache(cache, masks, past), [0]
        inputs = layout.prefill(input_ids)
    else:  # left-padded rows that accept their own counts (ragged_cache.RaggedCache, batch_decoding.py)
        if specdec_streamer is not None or tree_streamer is not None:
            streamer = specdec_streamer if specdec_streamer is not None else tree_streamer
        check_batch(cfg, proposer, streamer)
        mask = check_left_padded(
            input_ids, model_kwargs.get("attention_mask"), "batched speculative decoding", cfg.pad_token_id
        )
        layout = RaggedCache(verification_cache(model, cache_of(model_kwargs)), masks)
        inputs, pads = layout.prefill(input_ids, mask), (mask == 0).sum(1).tolist()
    t0 = tick(device)
    proposer.start(model, input_ids[:1, pads[0] :], cfg)  # a batch: one-time set-up (calibration...) on it
    limit = cfg.max_length if cfg.max_length is not None else NO_MAX_LENGTH
    rows = [Row(0, input_ids, pads[0], proposer, limit)]
    if len(pads) > 1:  # every row drafts with a shallow copy of the proposer, started on its own row
        rows = [Row(b, input_ids[b : b + 1], pads[b], copy.copy(proposer), limit) for b in range(len(pads))]
        for row in rows:
            row.proposer.start(model, row.tokens, cfg)
    stats.draft_time += tick(device) - t0
    outputs = GenerateOutputs(cfg)
    # learns c(q) from the steps
    observer = CostObserver(model, input_ids.shape[1] - pads[0], len(pads), proposer.cost_variant)
    finished = _decode(
        model,
        rows,
        layout,
        inputs,
        cfg,
        logits_processor,
        StopRule(stopping_criteria),
        outputs,
        stats,
        streamer,
        tick,
        batch_cost,
        observer,
    )
    observer.finish()
    finish(stats, streamer, t_start, device, tick)
    if len(rows) == 1:
        return outputs.result(finished[0], layout.cache)
    sequences = assemble(input_ids, finished, cfg)
    return GenerateDecoderOnlyOutput(sequences=sequences) if cfg.return_dict_in_generate else sequences


def _decode(
    model,
    rows,
    layout,
    inputs,
    cfg,
    logits_processor,
    stop,
    outputs,
    stats,
    streamer,
    tick,
    batch_cost,
    observer,
    joiner=None,
):
    """The loop, for every batch size: ONE target forward verifies every row's ``[root, tree]``; each row accepts on
    its own logits; ``layout`` keeps each row's accepted path in the cache; a finished row leaves the batch; the
    rest observe and propose the next trees. ``joiner`` (a ``refill.Refill``, continuous batching): after rows have
    left, the next forward may instead prefill a group of new rows on a cache of their own, which then join the
    batch; the loop ends when every row has finished and the joiner has no prompt left. Returns each row's final ids
    by row index."""
    device = rows[0].ids.device
    proposer, one = rows[0].proposer, len(rows) == 1
    need_hidden = outputs.hidden_states is not None or proposer.needs_hidden_states
    # the layers whose hidden states are gathered to the accepted rows: all for the output, else the proposer's
    layers = None if outputs.hidden_states is not None else proposer.hidden_layers
    need_attn = outputs.attentions is not None or proposer.needs_attentions
    do_sample, warned, finished = bool(cfg.do_sample), False, {}
    fed, positions, mask = inputs  # the prefill's
    fed_rows, fed_layout = rows, layout  # what this forward feeds: the batch, or a group joining it
    roots_at, is_prefill, draft_s = [fed.shape[1] - 1] * len(rows), True, 0.0
    while True:
        prefix = fed_layout.length  # cached entries before this forward (a batch of one: its sequence)
        t0, mark = tick(device), None if is_prefill else observer.start()
        out = model(
            input_ids=fed,
            position_ids=positions,
            attention_mask=mask,
            **{CACHE_ARGUMENT: fed_layout.cache},
            use_cache=True,
            output_hidden_states=need_hidden,
            output_attentions=need_attn,
            return_dict=True,
            **logits_to_keep(model, fed.shape[1] - min(roots_at)),
        )
        verify_s = tick(device) - t0
        if not is_prefill and len(rows) == observer.batch:
            observer.stop(fed.shape[1], mark)
        logits = out.logits.to(torch.float32)
        first = fed.shape[1] - logits.shape[1]  # fed index of logits row 0
        results = []
        # stats.steps' entry
        record = dict(rows=len(fed_rows), fed=fed.shape[1], nodes=0, depth=0, accepted=0)
        for i, row in enumerate(fed_rows):
            n, r = len(row.tree), roots_at[i]
            row_logits = logits[i, r - first : r - first + 1 + n]
            row.tree.check_vocab(row_logits.shape[-1])
            acc = accept_tree(row.tree, row_logits, row.ids, logits_processor, do_sample)
            before = row.ids.shape[1]
            row.ids, done = stop.append(row.ids, acc.tokens)
            m = row.ids.shape[1] - before  # tokens emitted (stopping criteria may cut the path short)
            # fed rows that stay: those up to the root (the prompt at the prefill, r = 0 after), the accepted nodes
            kept = [*range(r + 1), *(r + 1 + c for c in acc.nodes[: m - 1])]
            results.append((acc, m, done or row.ids.shape[1] >= row.max_length, kept, row_logits))
            if outputs.scores is not None or outputs.logits is not None:
                outputs.add(acc.scores[:m], row_logits[[k - r for k in kept[-m:]]])
            if streamer is not None:
                streamer.put(row.ids[0, -m:].cpu())
            record["nodes"] += n
            record["depth"] = max(record["depth"], row.tree.max_depth)
            record["accepted"] += m - 1
        fed_layout.keep_accepted([r[3] for r in results])
        emitted = sum(r[1] for r in results)
        stats.target_forwards += len(fed_rows)
        stats.batched_forwards += 1
        stats.drafted += record["nodes"]
        stats.accepted += record["accepted"]
        stats.verify_time += verify_s
        stats.draft_time += draft_s
        stats.steps.append(dict(record, new_tokens=emitted, draft_s=draft_s, verify_s=verify_s))

        t0 = tick(device)
        survivors, feedback = [], []
        for i, (row, (acc, m, done, kept, row_logits)) in enumerate(zip(fed_rows, results)):
            real = [k for k in kept if not is_prefill or k >= row.pad]  # a batch's prompt padding is no token
            keep = host_to_device(real, device) if need_hidden or need_attn else None
            hidden = gather_hidden(out.hidden_states, i, keep, layers) if need_hidden else None
            attn = gather_attentions(out.attentions, prefix, real, keep, fed.shape[1]) if need_attn else None
            if one:
                add_states(outputs, hidden, attn, prefix, len(kept), m)
            tree = None if is_prefill else row.tree
            fb = StepFeedback(
                row.tokens,
                acc.tokens[:m],
                m - 1,
                acc.nodes[: m - 1],
                tree,
                None,
                hidden,
                attn,
                is_prefill,
                row_logits,
            )
            if done:  # a finished row still observes its last forward (its cache view: before rows leave)
                finished[row.index] = row.ids
                fb.past_key_values = fed_layout.row_view(i)
                row.proposer.observe(fb)
            else:  # its cache view is taken after the rows that finished have left
                survivors.append(i)
                feedback.append((row, fb))
        del out
        if survivors and len(survivors) < len(fed_rows):  # no survivor: the layout is dropped or replaced
            fed_layout.select_rows(host_to_device(survivors, device))
        fed_rows = [fed_rows[i] for i in survivors]
        joined = 0  # the fed rows' first index in the batch
        if fed_layout is layout:
            rows = fed_rows
        elif rows:  # a group's prefill: its rows join the batch
            joined = len(rows)
            if fed_rows:
                layout.append_rows(fed_layout)
                rows = rows + fed_rows
        else:  # the batch was empty: the group is the batch
            layout, rows = fed_layout, fed_rows
        if not rows and not (joiner is not None and joiner.waiting):
            stats.draft_time += tick(device) - t0
            return finished
        if rows:
            layout.maybe_repack()
        for j, (row, fb) in enumerate(feedback, start=joined):
            fb.past_key_values = layout.row_view(j)
            row.proposer.observe(fb)
            row.tree, warned = _propose(row.proposer, row.tokens, row.max_length, layout, warned)
        if batch_cost is not None and len(rows) > 1:
            depth = best_depth([row.proposer for row in rows], [row.tree for row in rows], batch_cost)
            if depth is not None:
                for row in rows:
                    row.tree = row.tree.truncate_depth(depth)
        group = joiner.next(len(rows)) if joiner is not None else None
        draft_s = tick(device) - t0
        if group is not None:  # a group of new rows is prefilled on a cache of its own
            fed_layout, fed_rows, (fed, positions, mask) = group
            is_prefill, roots_at = True, [fed.shape[1] - 1] * len(fed_rows)
            continue
        fed_layout, fed_rows, is_prefill = layout, rows, False
        fed, positions, mask = layout.step(
            [row.tree for row in rows], torch.cat([r.ids[:, -1] for r in rows])
        )
        roots_at = [0] * len(rows)


def _propose(proposer: TreeProposer, input_ids: torch.Tensor, max_length: int, layout, warned: bool):
    """The proposer's tree for the next step (cut to the length budget; empty where ``layout`` cannot verify it: a
    caller's cache near its sliding window) and whether the sliding-window warning has been given."""
    budget = max_length - input_ids.shape[1] - 1
    tree = proposer.propose(input_ids, budget).truncate_depth(max(budget, 0))
    if tree.device != input_ids.device:
        raise SpecDecError(
            f"{type(proposer).__name__} proposed a tree on {tree.device}, the input is on {input_ids.device}; "
            "build the tree on input_ids.device"
        )
    if len(tree) and not layout.fits(1 + len(tree)):
        if not warned:
            logger.warning("a sliding-window cache layer is near its window: verifying without the tree")
            warned = True
        tree = TokenTree.empty(input_ids.device)
    return tree, warned
