"""Set-up shared by the chain candidate generators of the trained drafters (GLIDE, EDD) in transformers'
assisted-decoding loop: the proposal length gamma and what each draft step needs from the target's
``generation_config``."""

from __future__ import annotations

from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList, MinLengthLogitsProcessor

DEFAULT_GAMMA = 5  # proposal length when the drafter's generation_config sets none


def init_chain_drafting(
    generator: CandidateGenerator,
    drafter: PreTrainedModel,
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList | None,
) -> None:
    """Set ``generator``'s ``num_draft_tokens`` (gamma = the drafter's ``num_assistant_tokens``), ``do_sample``,
    ``max_length``, ``eos`` (list of eos ids, or None) and ``logits_processor`` (the target's processors
    without ``MinLengthLogitsProcessor``: a draft that ends early is only a shorter proposal, and the target's
    own processors still enforce the minimum length on what it accepts)."""
    generator.num_draft_tokens = int(
        getattr(drafter.generation_config, "num_assistant_tokens", None) or DEFAULT_GAMMA
    )
    generator.do_sample = bool(generation_config.do_sample)
    generator.max_length = generation_config.max_length
    eos = getattr(generation_config, "_eos_token_tensor", None)
    generator.eos = None if eos is None else eos.flatten().tolist()
    generator.logits_processor = LogitsProcessorList(
        p for p in (logits_processor or []) if not isinstance(p, MinLengthLogitsProcessor)
    )
