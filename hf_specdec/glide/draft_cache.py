"""GLIDE's own self-attention KV cache across steps (GLIDE with a CAPE, arXiv:2402.02082, §3, §4.1).

Every draft forward cross-attends to the target's KV cache *as verified so far*; the drafter's own self-attention
cache is kept across steps and cropped to the tokens that are still valid. CAPE's trees and GLIDE's chains
(``cape.py``) draft through it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache


class GlideDraftCache:
    """The drafter's own self-attention KV cache across rounds, and the tokens it holds (``fed``).

    Used by the CAPE proposer (``hf_specdec.glide.cape``: CAPE's trees and GLIDE's chain). Each round starts with
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
