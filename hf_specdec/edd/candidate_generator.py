"""EDD chain drafts in transformers' assisted loop (edd-pct.txt §3.1): ``target.generate(assistant_model=edd)``."""

from __future__ import annotations

import torch
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
from ..errors import SpecDecError
from .draft_state import EddDraftState


class EddCandidateGenerator(CandidateGenerator):
    """Chain drafts of gamma tokens (``num_assistant_tokens``, default 5) for transformers' assisted loop.

    ``draft_time`` (seconds spent in :meth:`get_candidates`) is timed only when ``timed`` is True (set it on the
    class or an instance): a timed round waits for a CUDA device twice (``core/timing.py``), and the assisted loop
    has no statistics to ask for it (the bench times the drafter's forwards with ``ForwardMeter`` hooks)."""

    requires_model_outputs = True
    model_kwargs_overrides = {"output_hidden_states": True}
    timed: bool = False

    def __init__(self, edd, target, generation_config, logits_processor=None):
        self.edd = edd
        self.target = target
        self.state = EddDraftState(edd)
        init_chain_drafting(self, edd, generation_config, logits_processor, target)  # gamma, eos, sizer
        self.prev_total: int | None = None  # length of the last candidate sequence we returned
        self.draft_time = 0.0

    def _take_hidden(self, input_ids: torch.Tensor, model_outputs) -> None:
        """Append the encoder-layer states of the positions the last forward verified to the soft prompt."""
        if model_outputs is None or not self.state.soft_prompt:
            return
        states = getattr(model_outputs, "hidden_states", None)
        if states is None:
            raise SpecDecError("the target returned no hidden_states; EDD needs output_hidden_states=True")
        h = states[self.edd.config.encoder_layer]
        start = self.prev_total - h.shape[1]  # position of the forward's first query token
        lo, hi = self.state.known(), input_ids.shape[1] - 1
        if lo < start:
            raise SpecDecError(f"EDD missed the hidden states of positions {lo}..{start - 1}")
        self.state.push_hidden(h[:, lo - start : hi - start])

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, model_kwargs=None, model_outputs=None, **kwargs):
        tick = clock if self.timed else untimed
        t0 = tick(input_ids.device)
        self._take_hidden(input_ids, model_outputs)
        cur_len = input_ids.shape[1]
        budget = min(self.num_draft_tokens, self.max_length - cur_len - 1)
        if budget <= 0 or (self.state.soft_prompt and self.state.known() == 0):
            self.prev_total = cur_len
            return input_ids, None
        chain_budget(self, self.edd, self.target, input_ids)
        if not chain_start(self):  # the gate: drafting has not paid lately (the state catches up next time)
            self.prev_total = cur_len
            return input_ids, None
        device = self.edd.decoder.norm.weight.device
        sequence = input_ids.to(device)
        hidden = self.state.root_step(sequence)
        scores = []
        for i in range(budget):
            token, processed, confidence = draft_token(
                self, self.edd, sequence, self.edd.draft_logits(hidden)
            )
            token_id, p = read_draft(token, confidence)
            kept, more = self.sizer.take(p, token_id)
            if not kept:
                break
            scores.append(processed)
            sequence = torch.cat([sequence, token], dim=1)
            if token_id in self.eos or i == budget - 1 or not more:
                break
            hidden = self.state.chain_step(token, sequence.shape[1] - 1)
        self.prev_total = sequence.shape[1]
        chain_drafted(self)
        self.draft_time += tick(input_ids.device) - t0
        return sequence, (torch.stack(scores, dim=1) if self.do_sample and scores else None)

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        chain_verified(self, input_ids, num_matches)  # gamma is constant; the gate learns
