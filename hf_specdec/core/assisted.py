"""The assisted loop's candidate generator: GLIDE/EDD drafters as ``assistant_model`` bring their own; a batch
with such a drafter runs the batched tree loop.

``target.generate(**inputs, assistant_model=drafter)`` runs transformers' assisted loop, which asks one
``GenerationMixin`` method for a candidate generator (``hf_compat.candidate_generator_hook``). transformers already
picks special generators by assistant type (Gemma-4 assistants, DFlash); drafters that read the target's state
(GLIDE reads the target's KV cache) need the same. ``install()`` (on ``import hf_specdec``) wraps that one method:
when the assistant defines ``make_candidate_generator(target=...,
generation_config=..., logits_processor=..., input_ids=..., model_kwargs=...)``, its generator is used; every other
call goes to transformers unchanged, with every argument passed through as given.

No silent fallback: if transformers stops asking this method (selection moved), an hf_specdec drafter reaches
transformers' generic generator, which calls ``drafter.generate``; that raises a ``SpecDecError``
(``modeling/attached.py``) instead of drafting with the wrong method.

The generator sets ``requires_model_outputs = True``, so the loop hands it ``model_kwargs`` (with the target's
``past_key_values``, cropped to the verified prefix) on every call. Verification, acceptance (greedy match or
speculative sampling) and cache cropping stay transformers' own, hence lossless. ``run_assisted_decoding``: a
``custom_generate`` loop (PLD+) runs the same loop with a generator it built itself.

**Batches** (issue #17). transformers' assisted loop refuses ``input_ids`` with more than one row ("assisted generate
is only supported for batch_size = 1"). ``install()`` also wraps that loop (``hf_compat.assisted_decoding_hook``):
when ``input_ids`` has more than one row and the assistant defines ``make_tree_proposer(target=...,
generation_config=..., logits_processor=...)`` (the GLIDE, vanilla and EDD drafters: their chain of gamma tokens as
a :class:`~hf_specdec.core.proposer.TreeProposer`), the call runs ``tree_generate`` on the left-padded batch and its
``attention_mask`` (``batch_decoding.py``): every row drafts its own chain, all rows are verified in one target
forward and each accepts its own number of tokens; a row that stops leaves the batch. Every other call (batch 1,
any other assistant, prompt lookup) goes to transformers' loop unchanged, so a batch with another assistant still
gets transformers' own error. The drafts are the drafter's argmax (deterministic), which the tree core verifies
losslessly greedily and with sampling (one-hot q): each row's greedy output is the row's plain greedy output, and
sampling follows the target's distribution per row. Batch-1-only features (streamers, ``output_scores`` /
``output_logits`` / hidden states / attentions) are errors at batch > 1 (``batch_decoding.py``). ``generate``
rejects unknown keywords such as ``stats=``, so the batched loop's ``DecodeStats`` is collected with
:func:`batch_stats` instead.

**Generation modes** (issue #31). With beam search (or DoLa, contrastive search...) transformers does not run the
assisted loop at all: it warns and decodes without the assistant. ``install()`` also wraps the mode check ``generate``
runs first (``hf_compat.generation_mode_hook``): with an hf_specdec drafter as ``assistant_model``, a mode the
drafters do not implement is a ``SpecDecError`` naming the option (``generate_io.check_generation_mode``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

from ..errors import SpecDecError
from ..hf_compat import (
    ASSISTED_DECODING_PARAMETERS,
    CACHE_ARGUMENT,
    ORIGINAL_ASSISTED_DECODING,
    ORIGINAL_GET_CANDIDATE_GENERATOR,
    ORIGINAL_VALIDATE_GENERATION_MODE,
    assisted_decoding,
    assisted_decoding_arguments,
    assisted_decoding_hook,
    candidate_generator_arguments,
    candidate_generator_hook,
    generation_mode_arguments,
    generation_mode_hook,
    set_assisted_decoding_hook,
    set_candidate_generator_hook,
    set_generation_mode_hook,
)
from .generate_io import check_generation_mode, check_prompt
from .sliding_window import verification_cache
from .stats import DecodeStats


def run_assisted_decoding(model, generator, *args, **kwargs):
    """transformers' assisted loop with ``generator`` (``hf_compat.assisted_decoding``), verifying into a cache of
    full layers where ``generate`` prepared sliding-window ones (``sliding_window.verification_cache``):
    transformers 5.13's loop cannot crop a sliding-window layer past its window."""
    if kwargs.get(CACHE_ARGUMENT) is not None:
        kwargs[CACHE_ARGUMENT] = verification_cache(model, kwargs[CACHE_ARGUMENT])
    return assisted_decoding(model, generator, *args, **kwargs)


_BATCH_STATS: contextvars.ContextVar[DecodeStats | None] = contextvars.ContextVar("batch_stats", default=None)


def _check_own_drafting(assistant, config) -> None:
    if config.prompt_lookup_num_tokens is not None or config.assistant_early_exit is not None:
        raise SpecDecError(
            f"assistant_model={type(assistant).__name__} drafts with its own candidate generator; drop "
            "prompt_lookup_num_tokens / assistant_early_exit (they select transformers' generators instead)"
        )


def _select_candidate_generator(self, *args, **kwargs):
    arguments = candidate_generator_arguments(self, args, kwargs)
    assistant = arguments.get("assistant_model")
    factory = getattr(assistant, "make_candidate_generator", None)
    if not callable(factory):
        return ORIGINAL_GET_CANDIDATE_GENERATOR(self, *args, **kwargs)
    config = arguments["generation_config"]
    _check_own_drafting(assistant, config)
    check_prompt(arguments["input_ids"], f"assistant_model={type(assistant).__name__}")
    return factory(
        target=self,
        generation_config=config,
        logits_processor=arguments["logits_processor"],
        input_ids=arguments["input_ids"],
        model_kwargs=arguments["model_kwargs"],
    )


def _assisted_decoding(self, *args, **kwargs):
    """transformers' assisted loop, except for a batch (more than one row) with an assistant that has
    ``make_tree_proposer``: that one runs the batched tree loop (module docstring)."""
    named, model_kwargs = assisted_decoding_arguments(self, args, kwargs)
    assistant, input_ids = named.get("assistant_model"), named.get("input_ids")
    factory = getattr(assistant, "make_tree_proposer", None)
    is_batch = torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[0] > 1
    if not (callable(factory) and is_batch):
        if callable(getattr(assistant, "make_candidate_generator", None)) and CACHE_ARGUMENT in kwargs:
            # full layers for a model with sliding-window ones (as run_assisted_decoding)
            kwargs[CACHE_ARGUMENT] = verification_cache(self, kwargs[CACHE_ARGUMENT])
        return ORIGINAL_ASSISTED_DECODING(self, *args, **kwargs)
    from .tree_decoding import tree_generate  # not at import: tree_decoding pulls in the whole tree core

    missing = [p for p in ASSISTED_DECODING_PARAMETERS if p not in named]
    if missing:
        raise SpecDecError(
            f"this transformers version's assisted loop has no parameters {missing} (hf_specdec/hf_compat.py, "
            "assisted_decoding): a batch with assistant_model= cannot run; generate the rows one at a time or use a "
            "supported transformers version"
        )
    config = named["generation_config"]
    _check_own_drafting(assistant, config)
    proposer = factory(target=self, generation_config=config, logits_processor=named["logits_processor"])
    stats = model_kwargs.pop("stats", None)  # a direct call's (generate lets only stats=None through)
    return tree_generate(
        self,
        input_ids,
        named["logits_processor"],
        named["stopping_criteria"],
        config,
        named["synced_gpus"],
        named["streamer"],
        proposer=proposer,
        stats=_BATCH_STATS.get() if stats is None else stats,
        **model_kwargs,
    )


def _validate_generation_mode(self, *args, **kwargs):
    """transformers' generation-mode check, after refusing a mode no hf_specdec drafter implements when the
    ``assistant_model`` is one (``generate_io.check_generation_mode``): transformers would otherwise run beam
    search (or DoLa...) and ignore the drafter. Every other call goes to transformers unchanged."""
    arguments = generation_mode_arguments(self, args, kwargs)
    assistant = (arguments.get("generation_mode_kwargs") or {}).get("assistant_model")
    if callable(getattr(assistant, "make_candidate_generator", None)):
        check_generation_mode(arguments["generation_config"], f"assistant_model={type(assistant).__name__}")
    return ORIGINAL_VALIDATE_GENERATION_MODE(self, *args, **kwargs)


@contextlib.contextmanager
def batch_stats(stats: DecodeStats | None = None) -> Iterator[DecodeStats]:
    """The ``DecodeStats`` of the batched ``generate(assistant_model=drafter)`` calls made inside the block (``generate``
    takes no ``stats=`` keyword for assisted generation)::

        with batch_stats() as stats:
            target.generate(**batch, assistant_model=drafter)

    Batch-1 calls run transformers' own loop and leave it untouched."""
    stats = DecodeStats() if stats is None else stats
    token = _BATCH_STATS.set(stats)
    try:
        yield stats
    finally:
        _BATCH_STATS.reset(token)


def install() -> None:
    """Route assistants with ``make_candidate_generator`` to their own generator, a batch with an assistant that
    has ``make_tree_proposer`` to the batched tree loop, and refuse generation modes such assistants do not
    implement (idempotent)."""
    set_candidate_generator_hook(_select_candidate_generator)
    set_assisted_decoding_hook(_assisted_decoding)
    set_generation_mode_hook(_validate_generation_mode)


def installed() -> bool:
    return (
        candidate_generator_hook() is _select_candidate_generator
        and assisted_decoding_hook() is _assisted_decoding
        and generation_mode_hook() is _validate_generation_mode
    )
