"""Tree speculative decoding as a ``generate(custom_generate=...)`` loop, with a pluggable tree proposer.

Usage::

    from hf_specdec.core.tree_decoding import tree_generate
    out = target.generate(**inputs, custom_generate=tree_generate, proposer=my_proposer, stats=DecodeStats())

Each step: the proposer drafts a :class:`~hf_specdec.core.tree.TokenTree` below the last committed token (the
root); ONE target forward verifies ``[root, nodes...]`` with tree positions and a tree mask
(``tree.py``); ``acceptance.py`` picks the accepted path plus one target token (greedy or lossless
sampling); ``kv_cache.py`` compacts the cache to that path. tau (tokens per target forward) is
``1 + accepted`` per step. The prefill is the same verification with the prompt fed and no tree below its last
token. Decoder-only models, ``sdpa`` or ``eager`` attention. A left-padded batch (with its ``attention_mask``) runs
in ``batch_decoding.py``: every row drafts, is verified in one forward and accepts on its own. Pass a streamer as
``specdec_streamer=`` (``generate`` does not forward its own ``streamer=`` to a ``custom_generate`` callable;
``generate_io.py``).
"""

from __future__ import annotations

import logging

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import Cache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..errors import SpecDecError
from .acceptance import accept_tree
from .batch_decoding import batched_tree_generate
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
from .kv_cache import check_tree_support, compact_cache
from .proposer import StepFeedback, TreeProposer
from .sliding_window import LayerMasks, verification_cache
from .stats import DecodeStats
from .timing import clock, untimed
from .tree import TokenTree

__all__ = ["StepFeedback", "TreeProposer", "tree_generate"]  # the proposer interface lives in proposer.py

logger = logging.getLogger(__name__)


def _gather_attentions(attentions, prefix_length: int, keep: torch.Tensor):
    """Rows ``keep`` and columns ``prefix + keep`` of each layer's attention map (the compacted view)."""
    cols = torch.cat([torch.arange(prefix_length, device=keep.device), prefix_length + keep])
    return tuple(a[:, :, keep.to(a.device)][..., cols.to(a.device)] for a in attentions)


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
    as ``_sample`` does). ``stats``, if given, is filled with per-step numbers (``DecodeStats.steps``).
    ``tree_streamer`` is the deprecated name of ``specdec_streamer``. ``batch_cost``: a batch's verification cost
    curve (``verify_cost.measured_cost(..., batch=B)``); with it the trees of a batch are cut to the depth that pays
    for the whole batch (``batch_decoding.best_depth``).
    """
    device = input_ids.device  # the model's (check_inputs); timed regions wait for it (core/timing.py)
    tick = clock if stats is not None else untimed  # no device sync for timings nobody asked for
    t_start = tick(device)
    if proposer is None:
        raise SpecDecError(
            "tree_generate needs a proposer: generate(..., custom_generate=tree_generate, proposer=...)"
        )
    check_generation_mode(generation_config or model.generation_config, "tree decoding")
    check_inputs(model, input_ids, model_kwargs, synced_gpus, "tree decoding", batch=True)
    if model_kwargs.get("use_cache") is False:
        raise SpecDecError("tree decoding needs the KV cache; do not pass use_cache=False")
    cfg = generation_config or model.generation_config
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    stopping_criteria = stopping_criteria_or_default(stopping_criteria, cfg)
    if input_ids.shape[0] > 1:  # a batch: every row on its own (core/batch_decoding.py)
        if specdec_streamer is not None or tree_streamer is not None:
            streamer = specdec_streamer if specdec_streamer is not None else tree_streamer
        cache = verification_cache(model, model_kwargs.get("past_key_values"))
        sequences = batched_tree_generate(
            model,
            input_ids,
            model_kwargs.get("attention_mask"),
            logits_processor,
            stopping_criteria,
            cfg,
            proposer,
            stats if stats is not None else DecodeStats(),
            cache,
            streamer,
            batch_cost=batch_cost,
        )
        if cfg.return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences=sequences, past_key_values=None)
        return sequences
    streamer = resolve_streamer(input_ids, streamer, specdec_streamer, tree_streamer=tree_streamer)
    stats = stats if stats is not None else DecodeStats()
    stop = StopRule(stopping_criteria)
    do_sample = bool(cfg.do_sample)
    outputs = GenerateOutputs(cfg)
    need_hidden = outputs.hidden_states is not None or proposer.needs_hidden_states
    # the layers whose hidden states are gathered to the accepted rows: all for the output, else the proposer's
    hidden_layers = None if outputs.hidden_states is not None else proposer.hidden_layers
    need_attn = outputs.attentions is not None or proposer.needs_attentions
    cache, past = prepare_cache(model, input_ids, model_kwargs)
    masks = LayerMasks(model)  # the tree mask per layer type (sliding windows)
    max_length = cfg.max_length if cfg.max_length is not None else NO_MAX_LENGTH

    t0 = tick(device)
    proposer.start(model, input_ids, cfg)
    stats.draft_time += tick(device) - t0

    # The prefill is the first verification: the prompt tokens not in the cache yet, no tree below the last one.
    prefix, tree, draft_s, warned, is_prefill = past, TokenTree.empty(input_ids.device), 0.0, False, True
    fed = input_ids[:, past:]
    positions = torch.arange(past, input_ids.shape[1], device=input_ids.device)[None]
    mask = None
    while True:
        n = len(tree)
        t0 = tick(device)
        out = model(
            input_ids=fed,
            position_ids=positions,
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=need_hidden,
            output_attentions=need_attn,
            return_dict=True,
            **logits_to_keep(model, 1 + n),
        )
        verify_s = tick(device) - t0
        logits = out.logits[0, -(1 + n) :].to(torch.float32)  # row 0: the root (the prompt's last token)
        tree.check_vocab(logits.shape[-1])
        acc = accept_tree(tree, logits, input_ids, logits_processor, do_sample)
        before = input_ids.shape[1]
        input_ids, finished = stop.append(input_ids, acc.tokens)
        m = input_ids.shape[1] - before  # tokens emitted (stopping criteria may cut the path short)
        # fed rows that stay in the sequence: the ones before the root (prefill), the root, the accepted nodes
        root = fed.shape[1] - 1 - n
        kept = [*range(root + 1), *(root + 1 + c for c in acc.nodes[: m - 1])]
        if n:
            compact_cache(cache, prefix, kept)
        if outputs.scores is not None or outputs.logits is not None:
            outputs.add(acc.scores[:m], logits[[k - root for k in kept[-m:]]])
        keep = torch.tensor(kept, dtype=torch.long, device=device) if need_hidden or need_attn else None
        hidden = _gather_hidden(out.hidden_states, keep, hidden_layers) if need_hidden else None
        attn = _gather_attentions(out.attentions, prefix, keep) if need_attn else None
        _add_states(outputs, hidden, attn, prefix, len(kept), m)
        del out
        if streamer is not None:
            streamer.put(input_ids[0, -m:].cpu())
        stats.target_forwards += 1
        stats.drafted += n
        stats.accepted += m - 1
        stats.verify_time += verify_s
        stats.draft_time += draft_s
        feedback = StepFeedback(
            input_ids,
            acc.tokens[:m],
            m - 1,
            acc.nodes[: m - 1],
            None if is_prefill else tree,
            cache,
            hidden,
            attn,
            is_prefill,
        )
        draft_s += _observe(proposer, stats, feedback, device, tick)
        stats.steps.append(
            dict(
                nodes=n,
                depth=tree.max_depth,
                accepted=m - 1,
                new_tokens=m,
                draft_s=draft_s,
                verify_s=verify_s,
            )
        )
        if finished:
            break

        prefix = input_ids.shape[1] - 1  # == cache length: the root is not cached yet
        tree, draft_s, warned = _propose(proposer, input_ids, max_length, cache, warned, tick)
        is_prefill = False
        fed, positions = tree.flat_tokens(input_ids[0, -1]), tree.position_ids(prefix)
        mask = masks.after_prefix(tree.attention_mask(prefix), positions, prefix) if len(tree) else None

    finish(stats, streamer, t_start, device, tick)
    return outputs.result(input_ids, cache)


def _gather_hidden(hidden_states, keep: torch.Tensor, layers) -> tuple:
    """The hidden states of the kept fed rows, per layer; only ``layers`` (``None``: every layer) are gathered, the
    others are ``None`` (a drafter reads one layer: gathering all of them every step is wasted work)."""
    return tuple(
        h[:, keep.to(h.device)] if layers is None or i in layers else None
        for i, h in enumerate(hidden_states)
    )


def _propose(
    proposer: TreeProposer, input_ids: torch.Tensor, max_length: int, cache: Cache, warned: bool, tick=clock
):
    """The proposer's tree for the next step (cut to the length budget; empty near a sliding window), the seconds
    it took, and whether the sliding-window warning has been given."""
    budget = max_length - input_ids.shape[1] - 1
    t0 = tick(input_ids.device)
    tree = proposer.propose(input_ids, budget)
    draft_s = tick(input_ids.device) - t0
    tree = tree.truncate_depth(max(budget, 0))
    if tree.device != input_ids.device:
        raise SpecDecError(
            f"{type(proposer).__name__} proposed a tree on {tree.device}, the input is on {input_ids.device}; "
            "build the tree on input_ids.device"
        )
    if len(tree) and not check_tree_support(cache, 1 + len(tree)):
        if not warned:
            logger.warning("a sliding-window cache layer is near its window: verifying without the tree")
            warned = True
        tree = TokenTree.empty(input_ids.device)
    return tree, draft_s, warned


def _add_states(outputs: GenerateOutputs, hidden, attn, prefix: int, kept: int, m: int) -> None:
    """Hidden states / attentions of the ``kept`` fed rows per emitted token, as ``_sample`` reports them: the first
    token's entry covers every kept row up to it (the whole prompt for the prefill), each later token its own row."""
    first = kept - m  # kept rows before the first emitting one
    for j in range(m):
        lo, hi = (0 if j == 0 else first + j), first + j + 1
        if outputs.hidden_states is not None:
            outputs.hidden_states.append(tuple(h[:, lo:hi] for h in hidden))
        if outputs.attentions is not None:
            outputs.attentions.append(tuple(a[:, :, lo:hi, : prefix + hi] for a in attn))


def _observe(
    proposer: TreeProposer, stats: DecodeStats, feedback: StepFeedback, device: torch.device, tick=clock
) -> float:
    t0 = tick(device)
    proposer.observe(feedback)
    dt = tick(device) - t0
    stats.draft_time += dt
    return dt
