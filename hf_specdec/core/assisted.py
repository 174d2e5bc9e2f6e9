"""The assisted loop's candidate generator: GLIDE/EDD drafters as ``assistant_model`` bring their own.

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
"""

from __future__ import annotations

from ..errors import SpecDecError
from ..hf_compat import (
    ORIGINAL_GET_CANDIDATE_GENERATOR,
    assisted_decoding,
    candidate_generator_arguments,
    candidate_generator_hook,
    set_candidate_generator_hook,
)
from .generate_io import check_prompt

run_assisted_decoding = assisted_decoding


def _select_candidate_generator(self, *args, **kwargs):
    arguments = candidate_generator_arguments(self, args, kwargs)
    assistant = arguments.get("assistant_model")
    factory = getattr(assistant, "make_candidate_generator", None)
    if not callable(factory):
        return ORIGINAL_GET_CANDIDATE_GENERATOR(self, *args, **kwargs)
    config = arguments["generation_config"]
    if config.prompt_lookup_num_tokens is not None or config.assistant_early_exit is not None:
        raise SpecDecError(
            f"assistant_model={type(assistant).__name__} drafts with its own candidate generator; drop "
            "prompt_lookup_num_tokens / assistant_early_exit (they select transformers' generators instead)"
        )
    check_prompt(arguments["input_ids"], f"assistant_model={type(assistant).__name__}")
    return factory(
        target=self,
        generation_config=config,
        logits_processor=arguments["logits_processor"],
        input_ids=arguments["input_ids"],
        model_kwargs=arguments["model_kwargs"],
    )


def install() -> None:
    """Route assistants with ``make_candidate_generator`` to their own generator (idempotent)."""
    set_candidate_generator_hook(_select_candidate_generator)


def installed() -> bool:
    return candidate_generator_hook() is _select_candidate_generator
