"""gamma, the proposal length of the trained drafters' chains (``assistant_model=``) and trees:
:data:`DEFAULT_GAMMA` is its one default for every method (GLIDE §5.1 and CAPE: gamma = 5; EDD Table 1: a draft
sequence of length 5); the drafters' ``generation_config.num_assistant_tokens`` (``modeling/``) and CAPE's proposal
length fall back to it."""

from __future__ import annotations

from transformers import PreTrainedModel

DEFAULT_GAMMA = 5  # gamma, the proposal length, when nothing else sets it


def chain_length(drafter: PreTrainedModel) -> int:
    """gamma of a drafter's chain: its ``generation_config.num_assistant_tokens``, else :data:`DEFAULT_GAMMA`."""
    return int(getattr(drafter.generation_config, "num_assistant_tokens", None) or DEFAULT_GAMMA)
