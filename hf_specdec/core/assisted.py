"""The one place that touches transformers internals: choosing the ``CandidateGenerator`` of the assisted loop.

Two entry points, both only redirect ``GenerationMixin._get_candidate_generator``:

- ``install()`` (on ``import hf_specdec``): an ``assistant_model`` may supply its own generator (below).
- ``run_assisted_decoding(model, generator, ...)``: a ``custom_generate`` loop (PLD+) runs transformers'
  ``_assisted_decoding`` with a generator it built itself.

Let an ``assistant_model`` supply its own ``CandidateGenerator``.

``target.generate(**inputs, assistant_model=drafter)`` runs transformers' ``_assisted_decoding`` loop, which
asks ``GenerationMixin._get_candidate_generator`` for a candidate generator. transformers already picks
special generators by assistant type (Gemma-4 assistants, DFlash); drafters that read the target's state
(GLIDE reads the target's KV cache) need the same. We wrap that one method: when the assistant defines
``make_candidate_generator(target=..., generation_config=..., logits_processor=..., input_ids=...,
model_kwargs=...)``, its generator is used; everything else goes to transformers unchanged.

The generator it returns sets ``requires_model_outputs = True``, so the loop hands it ``model_kwargs`` (with the
target's ``past_key_values``, cropped to the verified prefix) on every call. Verification, acceptance
(greedy match or speculative sampling) and cache cropping stay transformers' own, hence lossless.
Installed on ``import hf_specdec``; idempotent.
"""

from __future__ import annotations

from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.utils import GenerationMixin

from ..errors import SpecDecError

_ORIGINAL = GenerationMixin._get_candidate_generator


def _get_candidate_generator(
    self,
    generation_config,
    input_ids,
    inputs_tensor,
    logits_processor,
    model_kwargs,
    assistant_model=None,
    target_tokenizer=None,
    assistant_tokenizer=None,
):
    factory = getattr(assistant_model, "make_candidate_generator", None)
    if (
        callable(factory)
        and generation_config.prompt_lookup_num_tokens is None
        and generation_config.assistant_early_exit is None
    ):
        return factory(
            target=self,
            generation_config=generation_config,
            logits_processor=logits_processor,
            input_ids=input_ids,
            model_kwargs=model_kwargs,
        )
    return _ORIGINAL(
        self,
        generation_config=generation_config,
        input_ids=input_ids,
        inputs_tensor=inputs_tensor,
        logits_processor=logits_processor,
        model_kwargs=model_kwargs,
        assistant_model=assistant_model,
        target_tokenizer=target_tokenizer,
        assistant_tokenizer=assistant_tokenizer,
    )


def run_assisted_decoding(model, generator: CandidateGenerator, *args, **kwargs):
    """Run transformers' own ``_assisted_decoding`` loop with ``generator`` as its candidate generator.

    For ``custom_generate`` loops that bring their own generator (PLD+): ``_assisted_decoding`` builds its
    generator with ``self._get_candidate_generator(...)`` and takes none as an argument, so for the duration of
    the call the model *instance* answers that method with ``generator`` (an instance attribute, removed
    afterwards; the class and other models are untouched). Verification, acceptance and cache cropping stay
    transformers' own.
    """
    if "_get_candidate_generator" in vars(model):
        raise SpecDecError("PLD+ generate is already running on this model (re-entrant call)")
    model._get_candidate_generator = lambda **_: generator
    try:
        return model._assisted_decoding(*args, **kwargs)
    finally:
        del model._get_candidate_generator


def install() -> None:
    """Route assistants with ``make_candidate_generator`` to their own generator (idempotent)."""
    GenerationMixin._get_candidate_generator = _get_candidate_generator


def installed() -> bool:
    return GenerationMixin._get_candidate_generator is _get_candidate_generator
