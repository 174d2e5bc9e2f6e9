"""GLIDE's proposal step inside transformers' assisted-decoding loop (glide-cape.txt §3, §4.1).

``GlideCandidateGenerator`` drafts a chain of gamma tokens (``num_assistant_tokens`` of the drafter's
``generation_config``, default 5 as in the paper) autoregressively with the GLIDE drafter. Every draft forward
cross-attends to the target's KV cache *as verified so far*: transformers hands it the target's
``past_key_values`` (cropped after each verification to the accepted prefix, i.e. positions ``< t`` where
``x_t`` is the bonus token) because the generator sets ``requires_model_outputs``. The drafter keeps its own
self-attention cache across rounds and crops it to the tokens that are still valid.

Greedy: the draft is the argmax; transformers keeps the longest prefix that matches the target's argmax.
Sampling: the draft is sampled from the processed draft distribution q, returned as ``candidate_logits`` so
transformers' speculative sampling (accept with min(1, p/q), resample from max(p - q, 0)) keeps the target's
distribution exactly. Either way the output is the target's.

On the first round the target's cache is still empty (the prompt has not been through the target yet), so a
cross-attention drafter proposes nothing and that round is the target's ordinary prefill; the vanilla drafter
(no cross-attention) drafts from the first round.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation.candidate_generator import CandidateGenerator

from ..core.chain_drafting import (
    chain_budget,
    chain_drafted,
    chain_start,
    chain_verified,
    draft_token,
    init_chain_drafting,
    read_draft,
)
from ..core.timing import clock, untimed
from ..hf_compat import cache_of


class GlideDraftCache:
    """The drafter's own self-attention KV cache across rounds, and the tokens it holds (``fed``).

    Shared by the chain generator below and the CAPE proposer (``hf_specdec.glide.cape``). Each round starts with
    :meth:`sync` (keep the longest prefix of the committed tokens already fed; drafts that were rejected are
    cropped away), then :meth:`step` feeds the tokens after that prefix and returns the next-token draft logits.
    The cache holds exactly the tokens ``fed`` at positions ``0 .. len(fed) - 1``.

    Which of them are still valid is known from lengths alone, with no read of the tokens: the committed ones
    (every token fed but this round's drafts), then the drafts the verification accepted (:meth:`accepted`, the
    count the loop has already read to emit them). ``fed`` stays on the device; nothing here reads it.
    """

    def __init__(self, drafter):
        self.drafter = drafter
        self.cache = DynamicCache()
        # tokens whose keys/values are in self.cache (on the drafter's device), and how many are committed
        self.fed = torch.empty(0, dtype=torch.long, device=drafter.norm.weight.device)
        self.committed = 0
        self.forwards = 0  # drafter forwards so far

    def accepted(self, n: int) -> None:
        """The verification accepted this round's first ``n`` drafts: those the drafter was fed stay valid."""
        self.committed = min(self.committed + int(n), len(self.fed))

    def sync(self, input_ids: torch.LongTensor) -> int:
        """Crop the cache to the committed tokens it holds (``input_ids``'s last token excluded: it is fed next);
        returns their number, i.e. where the next :meth:`step` starts."""
        keep = min(self.committed, input_ids.shape[1] - 1)
        if keep < self.cache.get_seq_length():
            self.cache.crop(keep - self.cache.get_seq_length())
        self.fed, self.committed = self.fed[:keep], keep
        return keep

    def step(self, step_ids: torch.LongTensor, target_cache, draft: bool = False) -> torch.Tensor:
        """One drafter forward over ``step_ids`` (1, n), placed right after the cached tokens and cross-attending
        to ``target_cache`` (the target's verified KV cache); returns the float draft-vocabulary logits of the
        last position, (1, draft vocab). ``draft``: the tokens are this round's drafts (valid only once
        :meth:`accepted`), else committed ones."""
        device = self.drafter.norm.weight.device
        start = len(self.fed)
        positions = torch.arange(start, start + step_ids.shape[1], device=device)[None]
        hidden = self.drafter.hidden_states(
            step_ids.to(device),
            positions,
            self.cache,
            target_past_key_values=target_cache,
            first_position=start,
        )[:, -1:]
        self.fed = torch.cat([self.fed, step_ids[0].to(device)])
        self.committed = self.committed if draft else len(self.fed)
        self.forwards += 1
        return self.drafter.draft_logits(hidden)[:, 0].float()


class GlideCandidateGenerator(CandidateGenerator):
    """GLIDE's chain of gamma drafts for transformers' assisted loop (module docstring).

    ``draft_time`` (seconds spent in :meth:`get_candidates`) is timed only when ``timed`` is True (set it on the
    class or an instance): a timed round waits for a CUDA device twice (``core/timing.py``), and the assisted loop
    has no statistics to ask for it (the bench times the drafter's forwards with ``ForwardMeter`` hooks)."""

    requires_model_outputs = True
    model_kwargs_overrides: dict = {}
    timed: bool = False

    def __init__(self, drafter, target, generation_config, logits_processor=None):
        self.drafter = drafter
        self.target = target
        init_chain_drafting(self, drafter, generation_config, logits_processor, target)  # gamma, eos, sizer
        self.state = GlideDraftCache(drafter)
        self.draft_time = 0.0

    @property
    def draft_forwards(self) -> int:
        return self.state.forwards

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, model_kwargs=None, **kwargs):
        tick = clock if self.timed else untimed
        t0 = tick(input_ids.device)
        cur_len = input_ids.shape[1]
        budget = min(self.num_draft_tokens, self.max_length - cur_len - 1)
        target_cache = cache_of(model_kwargs)
        verified = target_cache.get_seq_length() if target_cache is not None else 0
        if budget <= 0 or (self.drafter.config.cross_attention and verified == 0):
            return input_ids, None
        chain_budget(self, self.drafter, self.target, input_ids)
        if not chain_start(self):  # the gate: drafting has not paid lately (the cache catches up next time)
            return input_ids, None
        keep = self.state.sync(input_ids)
        device = self.drafter.norm.weight.device
        step_ids = input_ids[:, keep:].to(device)
        sequence = input_ids.to(device)
        scores = []
        for i in range(budget):
            logits = self.state.step(step_ids, target_cache, draft=i > 0)
            token, processed, confidence = draft_token(self, self.drafter, sequence, logits)
            token_id, p = read_draft(token, confidence)
            kept, more = self.sizer.take(p, token_id)
            if not kept:
                break
            scores.append(processed)
            sequence = torch.cat([sequence, token], dim=1)
            step_ids = token
            if token_id in self.eos or not more:
                break
        chain_drafted(self)
        self.draft_time += tick(input_ids.device) - t0
        candidate_logits = torch.stack(scores, dim=1) if self.do_sample and scores else None
        return sequence, candidate_logits

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        self.state.accepted(num_matches)  # the drafts fed and accepted stay in the drafter's cache
        chain_verified(self, input_ids, num_matches)  # gamma is the paper's constant (§5.1); the gate learns
