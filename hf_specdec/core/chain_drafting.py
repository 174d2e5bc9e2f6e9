"""Set-up shared by the chain candidate generators of the trained drafters (GLIDE, EDD) in transformers'
assisted-decoding loop: the proposal length gamma and what each draft step needs from the target's
``generation_config``. :data:`DEFAULT_GAMMA` is gamma's one default for every method (GLIDE §5.1 and CAPE:
gamma = 5; EDD Table 1: a draft sequence of length 5): the drafters' ``generation_config.num_assistant_tokens``
(``modeling/``) and CAPE's proposal length fall back to it."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList, MinLengthLogitsProcessor

from .generate_io import eos_token_ids

DEFAULT_GAMMA = 5  # gamma, the proposal length, when nothing else sets it


def chain_length(drafter: PreTrainedModel) -> int:
    """gamma of a drafter's chain: its ``generation_config.num_assistant_tokens``, else :data:`DEFAULT_GAMMA`."""
    return int(getattr(drafter.generation_config, "num_assistant_tokens", None) or DEFAULT_GAMMA)


def init_chain_drafting(
    generator: CandidateGenerator,
    drafter: PreTrainedModel,
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList | None,
) -> None:
    """Set ``generator``'s ``num_draft_tokens`` (gamma = the drafter's ``num_assistant_tokens``), ``do_sample``,
    ``max_length``, ``eos`` (list of eos ids, empty when there are none) and ``logits_processor`` (the target's processors
    without ``MinLengthLogitsProcessor``: a draft that ends early is only a shorter proposal, and the target's
    own processors still enforce the minimum length on what it accepts)."""
    generator.num_draft_tokens = chain_length(drafter)
    generator.do_sample = bool(generation_config.do_sample)
    generator.max_length = generation_config.max_length
    generator.eos = eos_token_ids(generation_config)
    generator.logits_processor = LogitsProcessorList(
        p for p in (logits_processor or []) if not isinstance(p, MinLengthLogitsProcessor)
    )


def draft_token(
    generator: CandidateGenerator, drafter: PreTrainedModel, sequence: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chain draft token from the drafter's ``logits`` (over its draft vocabulary, ``modeling/attached.py``)
    at the end of ``sequence``: ``(token (1, 1), full-vocabulary processed logits or None)``. Greedy without
    logits processors takes the argmax over the draft vocabulary directly; otherwise the logits are mapped to the
    full vocabulary, processed like the target's, and sampled (``do_sample``) or maximised. The processed logits
    are what transformers' speculative sampling needs as the draft distribution q."""
    if not len(generator.logits_processor) and not generator.do_sample:
        token = logits.argmax(-1, keepdim=True)
        ids = drafter.draft_vocab_ids
        return (token if ids is None else ids[token]), None
    full = generator.logits_processor(sequence, drafter.to_full_vocab(logits.float()))
    if generator.do_sample:
        return torch.multinomial(full.softmax(-1), 1), full
    return full.argmax(-1, keepdim=True), full
