"""Tree speculative decoding as a ``generate(custom_generate=...)`` loop, with a pluggable tree proposer.

Usage::

    from hf_specdec.core.tree_decoding import tree_generate
    out = target.generate(**inputs, custom_generate=tree_generate, proposer=my_proposer, stats=DecodeStats())

Each step: the proposer drafts a :class:`~hf_specdec.core.tree.TokenTree` below the last committed token (the
root); ONE target forward verifies ``[root, nodes...]`` with tree positions and a tree mask
(``tree.py``); ``acceptance.py`` picks the accepted path plus one target token (greedy or lossless
sampling); ``kv_cache.py`` compacts the cache to that path. tau (tokens per target forward) is
``1 + accepted`` per step. Batch size 1, decoder-only models, ``sdpa`` or ``eager`` attention.

Note (transformers 5.23): ``generate`` does not forward ``streamer=`` to a ``custom_generate`` callable (it
only puts the prompt into it), so pass your streamer as ``tree_streamer=`` instead.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import Cache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..errors import SpecDecError
from .acceptance import accept_tree
from .kv_cache import check_cache_supported, check_tree_support, compact_cache
from .stats import DecodeStats
from .tree import TokenTree, additive_mask

logger = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("sdpa", "eager")


@dataclass
class StepFeedback:
    """What the target's forward taught us, handed to :meth:`TreeProposer.observe` after every forward.

    ``input_ids`` is the committed sequence after the step; its last token is the next root and is NOT in
    ``past_key_values`` (the target's compacted cache, length ``input_ids.shape[1] - 1``; read it, do not
    modify it). ``hidden_states`` / ``attentions`` (only when the proposer asked for them) cover the tokens
    this forward added to the cache, in sequence order: the whole prompt for the prefill, the root and the
    accepted nodes for a tree step; hidden states are a per-layer tuple of ``(1, m, hidden)``, attentions a
    per-layer tuple of ``(1, heads, m, cache_length)`` over the compacted cache.
    """

    input_ids: torch.Tensor
    new_tokens: list[int]
    num_accepted: int
    accepted_nodes: list[int]
    tree: TokenTree | None
    past_key_values: Cache
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    is_prefill: bool = False


class TreeProposer:
    """Drafts a token tree each step. Subclass and implement :meth:`propose`.

    Hooks for the methods built on top: a drafter reading the target's KV cache (GLIDE/CAPE) finds it in
    ``StepFeedback.past_key_values``; one conditioned on the target's hidden states (EDD/PCT) sets
    ``needs_hidden_states = True``; one using attention maps (PLD+) sets ``needs_attentions = True`` (needs
    ``attn_implementation="eager"``). Sampling proposers fill ``TokenTree.draft_probs``.
    """

    needs_hidden_states: bool = False
    needs_attentions: bool = False

    def start(self, model, input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
        """Called once before the prefill (reset per-generation state here)."""

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        """A tree below the root ``input_ids[0, -1]``; nodes deeper than ``max_depth`` are dropped."""
        raise NotImplementedError

    def observe(self, feedback: StepFeedback) -> None:
        """Called after every target forward (prefill included) with what was accepted."""


def _check_inputs(model, input_ids: torch.Tensor, proposer, model_kwargs: dict) -> None:
    if proposer is None:
        raise SpecDecError(
            "tree_generate needs a proposer: generate(..., custom_generate=tree_generate, proposer=...)"
        )
    if input_ids.shape[0] != 1:
        raise SpecDecError(
            f"tree decoding supports batch size 1 only (got {input_ids.shape[0]}); loop over the prompts"
        )
    if model.config.is_encoder_decoder:
        raise SpecDecError("tree decoding supports decoder-only models only")
    impl = model.config._attn_implementation
    if impl not in SUPPORTED_ATTENTION:
        raise SpecDecError(
            f"tree verification needs a custom 4D attention mask, which attn_implementation={impl!r} cannot "
            f"take; load the target with attn_implementation='sdpa' or 'eager'"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and mask.dim() == 2 and not bool(mask.all()):
        raise SpecDecError("tree decoding does not support padded inputs (attention_mask has zeros)")
    if model_kwargs.get("use_cache") is False:
        raise SpecDecError("tree decoding needs the KV cache; do not pass use_cache=False")


def _gather_attentions(attentions, prefix_length: int, keep: torch.Tensor):
    """Rows ``keep`` and columns ``prefix + keep`` of each layer's attention map (the compacted view)."""
    cols = torch.cat([torch.arange(prefix_length), prefix_length + keep])
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
    tree_streamer=None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """``custom_generate`` loop: propose a tree, verify it in one forward, accept, compact, repeat.

    Returns what ``generate`` returns (``sequences`` tensor, or a ``GenerateDecoderOnlyOutput`` with
    ``return_dict_in_generate=True``: scores / logits / hidden_states / attentions one entry per new token,
    as ``_sample`` does). ``stats``, if given, is filled with per-step numbers (``DecodeStats.steps``).
    """
    t_start = time.perf_counter()
    _check_inputs(model, input_ids, proposer, model_kwargs)
    if synced_gpus:
        raise SpecDecError("tree decoding does not support synced_gpus")
    cfg = generation_config or model.generation_config
    logits_processor = logits_processor or LogitsProcessorList()
    stopping_criteria = stopping_criteria or StoppingCriteriaList()
    streamer = streamer or tree_streamer
    if tree_streamer is not None:
        tree_streamer.put(input_ids.cpu())  # generate only puts the prompt into its own `streamer=`
    stats = stats if stats is not None else DecodeStats()
    do_sample = bool(cfg.do_sample)
    ret = bool(cfg.return_dict_in_generate)
    want_scores, want_logits = ret and cfg.output_scores, ret and cfg.output_logits
    want_hidden, want_attn = ret and cfg.output_hidden_states, ret and cfg.output_attentions
    need_hidden = want_hidden or proposer.needs_hidden_states
    need_attn = want_attn or proposer.needs_attentions
    scores, raw_logits, all_hidden, all_attn = [], [], [], []

    cache = model_kwargs.get("past_key_values")
    if cache is None:
        cache = DynamicCache(config=model.config)
    check_cache_supported(cache)
    max_length = cfg.max_length if cfg.max_length is not None else 10**9

    t0 = time.perf_counter()
    proposer.start(model, input_ids, cfg)
    stats.draft_time += time.perf_counter() - t0

    # Prefill: every prompt token not in the cache yet; its last logits give the first new token.
    past = cache.get_seq_length()
    if past >= input_ids.shape[1]:
        raise SpecDecError("the passed cache already covers the whole prompt; pass at least one new token")
    extra = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
    t0 = time.perf_counter()
    out = model(
        input_ids=input_ids[:, past:],
        position_ids=torch.arange(past, input_ids.shape[1], device=input_ids.device)[None],
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=need_hidden,
        output_attentions=need_attn,
        return_dict=True,
        **extra,
    )
    verify_s = time.perf_counter() - t0
    stats.verify_time += verify_s
    stats.target_forwards += 1
    logits = out.logits[0, -1:].to(torch.float32)
    acc = accept_tree(TokenTree.empty(input_ids.device), logits, input_ids, logits_processor, do_sample)
    hidden = tuple(out.hidden_states) if need_hidden else None
    attn = tuple(out.attentions) if need_attn else None
    if want_hidden:
        all_hidden.append(hidden)
    if want_attn:
        all_attn.append(attn)
    input_ids, finished = _append(input_ids, acc.tokens[:1], stopping_criteria)
    _record(scores, raw_logits, want_scores, want_logits, acc.scores[:1], logits[:1])
    if streamer is not None:
        streamer.put(input_ids[:, -1:].cpu())
    del out
    _observe(proposer, stats, StepFeedback(input_ids, acc.tokens[:1], 0, [], None, cache, hidden, attn, True))
    stats.steps.append(dict(nodes=0, depth=0, accepted=0, new_tokens=1, draft_s=0.0, verify_s=verify_s))
    warned = False

    while not finished:
        prefix = input_ids.shape[1] - 1  # == cache length: the root is not cached yet
        t0 = time.perf_counter()
        tree = proposer.propose(input_ids, max_length - input_ids.shape[1] - 1)
        draft_s = time.perf_counter() - t0
        tree = tree.truncate_depth(max(max_length - input_ids.shape[1] - 1, 0))
        tree.tokens = tree.tokens.to(input_ids.device)
        n = len(tree)
        if n and not check_tree_support(cache, 1 + n):
            if not warned:
                logger.warning("a sliding-window cache layer is near its window: verifying without the tree")
                warned = True
            tree, n = TokenTree.empty(input_ids.device), 0
        t0 = time.perf_counter()
        out = model(
            input_ids=tree.flat_tokens(input_ids[0, -1]),
            position_ids=tree.position_ids(prefix),
            attention_mask=additive_mask(tree.attention_mask(prefix), model.dtype) if n else None,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=need_hidden,
            output_attentions=need_attn,
            return_dict=True,
        )
        verify_s = time.perf_counter() - t0
        logits = out.logits[0].to(torch.float32)
        if n and int(tree.tokens.max()) >= logits.shape[-1]:
            raise SpecDecError(
                f"the proposer drafted a token id >= the target's vocabulary ({logits.shape[-1]})"
            )
        acc = accept_tree(tree, logits, input_ids, logits_processor, do_sample)
        input_ids, finished = _append(input_ids, acc.tokens, stopping_criteria)
        m = input_ids.shape[1] - 1 - prefix  # tokens emitted (stopping criteria may cut the path short)
        keep = torch.tensor([0] + [c + 1 for c in acc.nodes[: m - 1]], dtype=torch.long)
        if n:
            compact_cache(cache, prefix, keep)
        _record(scores, raw_logits, want_scores, want_logits, acc.scores[:m], logits[keep.to(logits.device)])
        hidden = tuple(h[:, keep.to(h.device)] for h in out.hidden_states) if need_hidden else None
        attn = _gather_attentions(out.attentions, prefix, keep) if need_attn else None
        if want_hidden:
            all_hidden += [tuple(h[:, j : j + 1] for h in hidden) for j in range(m)]
        if want_attn:
            all_attn += [tuple(a[:, :, j : j + 1, : prefix + j + 1] for a in attn) for j in range(m)]
        del out
        if streamer is not None:
            streamer.put(input_ids[0, -m:].cpu())
        stats.target_forwards += 1
        stats.drafted += n
        stats.accepted += m - 1
        stats.verify_time += verify_s
        stats.draft_time += draft_s
        feedback = StepFeedback(
            input_ids, acc.tokens[:m], m - 1, acc.nodes[: m - 1], tree, cache, hidden, attn
        )
        draft_s += _observe(proposer, stats, feedback)
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

    if streamer is not None:
        streamer.end()
    stats.new_tokens = sum(s["new_tokens"] for s in stats.steps)
    stats.total_time += time.perf_counter() - t_start
    if not ret:
        return input_ids
    return GenerateDecoderOnlyOutput(
        sequences=input_ids,
        scores=tuple(scores) if want_scores else None,
        logits=tuple(raw_logits) if want_logits else None,
        attentions=tuple(all_attn) if want_attn else None,
        hidden_states=tuple(all_hidden) if want_hidden else None,
        past_key_values=cache,
    )


def _append(input_ids, tokens, stopping_criteria):
    """Append ``tokens`` one at a time, stopping at the first one that ends generation (EOS, max length,
    stop strings...), as a plain loop would; returns the new ids and whether generation is finished."""
    for t in tokens:
        input_ids = torch.cat([input_ids, input_ids.new_tensor([[t]])], dim=-1)
        if bool(stopping_criteria(input_ids, None).any()):
            return input_ids, True
    return input_ids, False


def _record(scores, raw_logits, want_scores, want_logits, step_scores, step_logits):
    if want_scores:
        scores += step_scores
    if want_logits:
        raw_logits += [step_logits[j : j + 1] for j in range(len(step_scores))]


def _observe(proposer: TreeProposer, stats: DecodeStats, feedback: StepFeedback) -> float:
    t0 = time.perf_counter()
    proposer.observe(feedback)
    dt = time.perf_counter() - t0
    stats.draft_time += dt
    return dt
