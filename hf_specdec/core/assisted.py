"""``assistant_model=`` with an hf_specdec drafter: the drafter's chain runs in the tree core's loop.

``target.generate(**inputs, assistant_model=drafter)`` runs transformers' assisted loop, ``_assisted_decoding``.
``install()`` (on ``import hf_specdec``) wraps that one method (``hf_compat.assisted_decoding_hook``): when the
assistant defines ``make_tree_proposer(target=..., generation_config=..., logits_processor=..., input_ids=...,
model_kwargs=...)`` (the GLIDE, vanilla and EDD drafters: their chain of up to gamma tokens as a
:class:`~hf_specdec.core.proposer.TreeProposer`), the call runs ``tree_generate`` instead, at any batch size (a
left-padded batch with its ``attention_mask``: every row drafts its own chain and accepts its own count). Every other
call (another assistant model, prompt lookup, no assistant) goes to transformers' loop unchanged, every argument
passed through as given, so transformers' own assisted generation and its errors stay its own.

No silent fallback: if transformers stops running this method, an hf_specdec drafter reaches transformers' generic
candidate generator, which calls ``drafter.generate``; that raises a ``SpecDecError`` (``modeling/attached.py``)
instead of drafting with the wrong method.

The drafts are the drafter's argmax (deterministic), which the tree core verifies losslessly greedily and with
sampling (one-hot q). ``generate`` rejects unknown keywords such as ``stats=``, so the loop's ``DecodeStats`` is
collected with :func:`batch_stats`.

**Generation modes.** With beam search (or DoLa, contrastive search...) transformers does not run the assisted loop
at all: it warns and decodes without the assistant. ``install()`` also wraps the mode check ``generate`` runs first
(``hf_compat.generation_mode_hook``): with an hf_specdec drafter as ``assistant_model``, a mode the drafters do not
implement is a ``SpecDecError`` naming the option (``generate_io.check_generation_mode``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..errors import SpecDecError
from ..hf_compat import (
    ASSISTED_DECODING_PARAMETERS,
    ORIGINAL_ASSISTED_DECODING,
    ORIGINAL_VALIDATE_GENERATION_MODE,
    assisted_decoding_arguments,
    assisted_decoding_hook,
    generation_mode_arguments,
    generation_mode_hook,
    set_assisted_decoding_hook,
    set_generation_mode_hook,
)
from .generate_io import check_generation_mode, check_prompt
from .stats import DecodeStats

_BATCH_STATS: contextvars.ContextVar[DecodeStats | None] = contextvars.ContextVar("batch_stats", default=None)


def _check_own_drafting(assistant, config) -> None:
    if config.prompt_lookup_num_tokens is not None or config.assistant_early_exit is not None:
        raise SpecDecError(
            f"assistant_model={type(assistant).__name__} drafts with its own proposer; drop "
            "prompt_lookup_num_tokens / assistant_early_exit (they select transformers' generators instead)"
        )


def _assisted_decoding(self, *args, **kwargs):
    """transformers' assisted loop, except with an assistant that has ``make_tree_proposer``: that one runs the tree
    core's loop (module docstring)."""
    named, model_kwargs = assisted_decoding_arguments(self, args, kwargs)
    assistant, input_ids = named.get("assistant_model"), named.get("input_ids")
    factory = getattr(assistant, "make_tree_proposer", None)
    if not callable(factory):
        return ORIGINAL_ASSISTED_DECODING(self, *args, **kwargs)
    from .tree_decoding import tree_generate  # not at import: tree_decoding pulls in the whole tree core

    missing = [p for p in ASSISTED_DECODING_PARAMETERS if p not in named]
    if missing:
        raise SpecDecError(
            f"this transformers version's assisted loop has no parameters {missing} (hf_specdec/hf_compat.py, "
            "assisted_decoding): assistant_model= with an hf_specdec drafter cannot run; use a supported "
            "transformers version"
        )
    config = named["generation_config"]
    _check_own_drafting(assistant, config)
    check_prompt(input_ids, f"assistant_model={type(assistant).__name__}", batch=True)
    proposer = factory(
        target=self,
        generation_config=config,
        logits_processor=named["logits_processor"],
        input_ids=input_ids,
        model_kwargs=model_kwargs,
    )
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
    if callable(getattr(assistant, "make_tree_proposer", None)):
        check_generation_mode(arguments["generation_config"], f"assistant_model={type(assistant).__name__}")
    return ORIGINAL_VALIDATE_GENERATION_MODE(self, *args, **kwargs)


@contextlib.contextmanager
def batch_stats(stats: DecodeStats | None = None) -> Iterator[DecodeStats]:
    """The ``DecodeStats`` of the ``generate(assistant_model=drafter)`` calls with an hf_specdec drafter made inside the
    block (``generate`` takes no ``stats=`` keyword for assisted generation)::

        with batch_stats() as stats:
            target.generate(**batch, assistant_model=drafter)
    """
    stats = DecodeStats() if stats is None else stats
    token = _BATCH_STATS.set(stats)
    try:
        yield stats
    finally:
        _BATCH_STATS.reset(token)


def install() -> None:
    """Route assistants with ``make_tree_proposer`` to the tree core's loop and refuse generation modes they do not
    implement (idempotent)."""
    set_assisted_decoding_hook(_assisted_decoding)
    set_generation_mode_hook(_validate_generation_mode)


def installed() -> bool:
    return (
        assisted_decoding_hook() is _assisted_decoding and generation_mode_hook() is _validate_generation_mode
    )
