"""``hf_specdec.pld_plus``: PLD+ as a ``custom_generate`` function (PLD+, arXiv:2412.01447, §4, App. D).

Usage::

    out = target.generate(**inputs, custom_generate=hf_specdec.pld_plus, pld_variant="hidden", max_new_tokens=256)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from ..core.generate_io import (
    check_generation_mode,
    check_prompt,
    eos_token_ids,
    first_row,
    resolve_streamer,
)
from ..core.stats import DecodeStats
from ..core.tree_decoding import tree_generate
from ..core.verify_cost import CostCurve, measured_cost
from ..errors import SpecDecError
from .attention_capture import capture_selected_attention
from .attribution import PLDPlusGenerateOutput, merge_spans
from .candidate_generator import PLDPlusCandidateGenerator, resolve_layer
from .defaults import DEFAULT_MAX_TOKENS, DEFAULT_MIN_SCORE, DEFAULT_PRIORS, DEFAULT_TOP_HEADS
from .heads_file import default_heads_file, read_heads_file
from .proposer import PLDPlusProposer, cost_variant

VARIANTS = {"hidden": "hidden", "h": "hidden", "attention": "attention", "a": "attention"}


def _heads_for(model, heads_file: str | Path | None, top_heads: int | None) -> dict[int, torch.Tensor]:
    path = heads_file if heads_file is not None else default_heads_file(model)
    heads = read_heads_file(path, model=model, top=top_heads or DEFAULT_TOP_HEADS)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    return {
        layer: torch.tensor(sorted(hs), dtype=torch.long, device=model.device)
        for layer, hs in by_layer.items()
    }


def pld_plus(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    pld_variant: str = "hidden",
    pld_num_tokens: int | None = None,
    pld_max_num_tokens: int | None = None,
    pld_layer: int | None = None,
    pld_heads: str | Path | None = None,
    pld_top_heads: int | None = None,
    pld_min_score: float | None = None,
    pld_cost: CostCurve | None = None,
    pld_priors: tuple[float, float, float] | None = None,
    pld_return_attribution: bool = False,
    specdec_streamer=None,
    pld_streamer=None,
    stats: DecodeStats | None = None,
    **model_kwargs,
):
    """``custom_generate`` for PLD+: ``model.generate(**inputs, custom_generate=hf_specdec.pld_plus, ...)``.

    Every ``generate`` argument works as usual (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``,
    ``return_dict_in_generate`` ...). Both variants propose into the tree core's loop (``proposer.py``); a
    left-padded batch with its ``attention_mask`` runs PLD+(h) per row.

    Threads: PLD+(a) on an ``sdpa`` model switches ``model.config``'s attention implementation to a capturing
    wrapper for the call and restores it on every exit, exceptions included (``attention_capture.py``); two threads
    must not share one model while one of them is inside this ``generate``.

    Args:
        pld_variant: ``"hidden"`` (PLD+(h), default) or ``"attention"`` (PLD+(a)).
        pld_num_tokens: a fixed ``K``, tokens drafted per step (the paper's §4.3). Default: adaptive, each step
            drafts the ``K`` with the best expected time gain on this machine (:class:`DraftLength`).
        pld_max_num_tokens: adaptive mode's largest ``K`` (default :data:`DEFAULT_MAX_TOKENS`).
        pld_cost: adaptive mode's verification cost curve (:class:`~hf_specdec.core.verify_cost.CostCurve`); default:
            the model's curve on this machine, learnt from the decoding's own forwards (``core/verify_cost.py``).
        pld_priors: adaptive mode's prior hit rates of a fresh occurrence and of a running copy, and continuation rate
            (default :data:`DEFAULT_PRIORS`, from the summarize tuning).
        pld_layer: PLD+(h)'s hidden-state index ``l`` (default: :data:`DEFAULT_LAYER_FRACTION` of the depth).
        pld_heads: PLD+(a)'s heads file (``hf-specdec find-heads``); default: the shipped file of the named
            target ``model`` is (matched by fingerprint: SmolLM2-135M-Instruct, gemma-3-270m).
        pld_top_heads: how many of the file's top-ranked heads PLD+(a) uses (default :data:`DEFAULT_TOP_HEADS`).
        pld_min_score: no draft when the best occurrence scores below this (cosine for (h), attention for (a));
            default :data:`DEFAULT_MIN_SCORE`, ``-1`` turns it off.
        pld_return_attribution: return a :class:`PLDPlusGenerateOutput` whose ``attribution`` lists, for every
            copied-and-accepted span, the context position it was copied from (App. D).
        stats: a ``DecodeStats`` filled by a batch's run (tau, forwards; ``core/batch_decoding.py``).
        specdec_streamer: a streamer (``TextStreamer`` ...). transformers 5.23's ``generate`` does not hand its own
            ``streamer=`` to a ``custom_generate`` callable (it only puts the prompt into it), so pass it here
            (``core/generate_io.py``); ``pld_streamer`` is its deprecated name.
    """
    variant = VARIANTS.get(str(pld_variant).lower())
    if variant is None:
        raise SpecDecError(f"pld_variant must be 'hidden' or 'attention', got {pld_variant!r}")
    check_generation_mode(generation_config or model.generation_config, "custom_generate=hf_specdec.pld_plus")
    check_prompt(input_ids, "custom_generate=hf_specdec.pld_plus", batch=True)
    if pld_priors is not None and len(tuple(pld_priors)) != 3:
        raise SpecDecError(
            "pld_priors takes three probabilities: the hit rate of a fresh occurrence, of a running copy, and the "
            f"continuation rate (default {DEFAULT_PRIORS}); got {pld_priors!r}"
        )
    batch = input_ids.shape[0] > 1
    if batch and (variant != "hidden" or pld_return_attribution):
        raise SpecDecError(
            "custom_generate=hf_specdec.pld_plus takes a batch with pld_variant='hidden' and without "
            "pld_return_attribution; PLD+(a) and the attribution run at batch size 1 (loop over the rows)"
        )
    if pld_num_tokens is not None:
        k, cost = pld_num_tokens, None
    else:
        k = DEFAULT_MAX_TOKENS if pld_max_num_tokens is None else pld_max_num_tokens
        rows = input_ids.shape[0]
        cost = (
            pld_cost
            if pld_cost is not None
            else measured_cost(model, first_row(input_ids, model_kwargs), rows, cost_variant(variant))
        )
    eos = eos_token_ids(generation_config)
    common = dict(
        num_draft_tokens=k,
        max_length=generation_config.max_length,
        eos_token_id=torch.tensor(eos, device=input_ids.device) if eos else None,
        min_score=DEFAULT_MIN_SCORE[variant] if pld_min_score is None else float(pld_min_score),
        cost=cost,
        priors=DEFAULT_PRIORS if pld_priors is None else tuple(pld_priors),
    )
    if variant == "hidden":
        common.update(
            layer=resolve_layer(model, pld_layer),
            hidden_size=model.config.get_text_config().hidden_size,
            device=input_ids.device,
        )
        capture = contextlib.nullcontext(None)
    else:
        if (generation_config.return_dict_in_generate and generation_config.output_attentions) or (
            model_kwargs.get("output_attentions")
        ):
            raise SpecDecError(
                "pld_variant='attention' computes the attention weights of its induction heads only, so it returns "
                "no attention maps; drop output_attentions, or use pld_variant='hidden'"
            )
        common.update(heads=_heads_for(model, pld_heads, pld_top_heads))
        # a step verifies at most k + 1 tokens: the heads' weights of the prompt's other rows are never read
        capture = capture_selected_attention(model, common["heads"], last_rows=k + 1)
    if not batch:  # the prompt goes into the streamer here (and the old keyword warns by its name)
        streamer = resolve_streamer(input_ids, streamer, specdec_streamer, pld_streamer=pld_streamer)
        specdec_streamer = pld_streamer = None
    # the tree core, at batch 1 as on a batch (PLD+(h) per row): one host read per step for the acceptance and one
    # for the ranking
    with capture as heads_only:
        if heads_only is not None:
            common["heads_only"] = heads_only
        proposer = PLDPlusProposer(lambda: PLDPlusCandidateGenerator(variant, **common), variant)
        out = tree_generate(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            proposer=proposer,
            stats=stats,
            batch_cost=cost if batch else None,
            specdec_streamer=specdec_streamer if specdec_streamer is not None else pld_streamer,
            **model_kwargs,
        )
    return _with_attribution(out, proposer.generator.spans) if pld_return_attribution else out


def _with_attribution(out, spans) -> PLDPlusGenerateOutput:
    """``generate``'s output with the copied-and-accepted spans (App. D) attached."""
    spans = merge_spans(spans)
    if isinstance(out, torch.Tensor):
        return PLDPlusGenerateOutput(sequences=out, attribution=spans)
    return PLDPlusGenerateOutput(**dict(out.items()), attribution=spans)
