"""PLD+ drafting (PLD+, arXiv:2412.01447, §4.2-4.3) as a transformers ``CandidateGenerator``: the artifacts of each
verification forward (hidden state ``l``, or the induction heads' attention rows) rank the occurrences of the last
token, and the tokens after the best one are the draft."""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ..core.verify_cost import CostCurve
from ..errors import SpecDecError
from .attribution import CopiedSpan
from .defaults import DEFAULT_LAYER_FRACTION, DEFAULT_PRIORS
from .draft_length import DraftLength
from .ranking import rank_by_attention, rank_by_hidden


def resolve_layer(model, layer: int | None) -> int:
    """Index into ``output_hidden_states`` (``0..num_hidden_layers``; negative counts from the end)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    if layer is None:
        return max(1, round(DEFAULT_LAYER_FRACTION * n_layers))
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise SpecDecError(f"pld_layer must be an integer, got {layer!r}")
    if not -(n_layers + 1) <= layer <= n_layers:
        raise SpecDecError(
            f"pld_layer={layer} is out of range: this model has {n_layers} layers, so hidden states "
            f"0..{n_layers} (0 = embeddings) or negative indices down to {-(n_layers + 1)}"
        )
    return layer % (n_layers + 1)


class PLDPlusCandidateGenerator(CandidateGenerator):
    """PLD+ drafting (PLD+, arXiv:2412.01447, §4.2-4.3) as a transformers ``CandidateGenerator``.

    It drafts from the verification forward's outputs (``requires_model_outputs``; ``model_kwargs_overrides``:
    hidden state ``l`` for PLD+(h), the attentions for PLD+(a), see :func:`capture_selected_attention`), which the
    tree core hands over (``proposer.PLDPlusProposer``). A call before the prefill has run proposes nothing, so the
    prefill is the ordinary first forward.

    Args:
        variant: ``"hidden"`` or ``"attention"``.
        num_draft_tokens: ``K``, the most tokens drafted per step.
        cost: the measured verification cost curve; with it ``K`` adapts per step (:class:`DraftLength`), without
            it every draft has ``K`` tokens.
        priors: :class:`DraftLength`'s prior hit rates (fresh occurrence, running copy) and continuation rate.
        hidden_size / max_length: size the incremental hidden-state store (PLD+(h)); ``device``: where it lives (the
            model's; default CPU).
        layer: hidden-state index ``l`` (PLD+(h)).
        heads: ``{layer: head indices}`` of the induction heads (PLD+(a)).
        heads_only: ``True`` when ``outputs.attentions`` holds only the selected layers/heads (wrapper), ``False``
            when it holds every layer and head (eager model).
        eos_token_id: drafts are cut after their first EOS (the loop would drop what follows anyway).
        min_score: skip the draft when the best occurrence scores below this (App. B.3's threshold; ``None``: off).
    """

    requires_model_outputs = True

    def __init__(
        self,
        variant: str,
        num_draft_tokens: int,
        max_length: int,
        hidden_size: int | None = None,
        layer: int | None = None,
        heads: dict[int, torch.Tensor] | None = None,
        heads_only: bool = True,
        eos_token_id: torch.Tensor | None = None,
        device: torch.device | str | None = None,
        min_score: float | None = None,
        cost: CostCurve | None = None,
        priors: tuple[float, float, float] = DEFAULT_PRIORS,
    ):
        if variant not in ("hidden", "attention"):
            raise SpecDecError(f"pld_variant must be 'hidden' or 'attention', got {variant!r}")
        if not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise SpecDecError(f"pld_num_tokens must be a positive integer, got {num_draft_tokens!r}")
        self.variant = variant
        self.num_draft_tokens = num_draft_tokens
        self.lengths = DraftLength(num_draft_tokens, cost, *priors)
        # (output position, source position, kind) of the copy the last step did not draft
        self._skipped: tuple[int, int, str] | None = None
        self.max_length = max_length
        self.layer = layer
        self.heads = heads or {}
        self.heads_only = heads_only
        self.eos_token_id = eos_token_id
        self.min_score = min_score
        if variant == "hidden":
            if layer is None or hidden_size is None:
                raise SpecDecError("PLD+(h) needs the hidden-state layer and the hidden size")
            # all hidden states (references to tensors the forward computes anyway): the list form
            # (output_hidden_states=[l]) indexes differently across transformers releases (5.17-5.22: decoder layers)
            self.model_kwargs_overrides: dict[str, Any] = {"output_hidden_states": True}
            self._states = torch.empty(max_length, hidden_size, dtype=torch.float32, device=device)
        else:
            if not self.heads:
                raise SpecDecError("PLD+(a) needs at least one induction head (a heads file, see find-heads)")
            self.model_kwargs_overrides = {"output_attentions": True}
            self._layers = sorted(self.heads)
        self._stored = 0  # positions 0.._stored-1 have their artifacts stored (always t after a step)
        self._rows: list[torch.Tensor] | None = None  # PLD+(a): latest forward's selected attention rows
        self._row_offset = 0  # absolute position of row 0 in `_rows`
        self._pending: tuple[int, int, int] | None = (
            None  # (output position, source position, length) of a draft
        )
        self.spans: list[CopiedSpan] = []
        # the sequence on the host: the occurrences, the drafts and every check read it, not the device; it grows by
        # the tokens the loop emitted (the tree core hands them over, ``extend``; else read from input_ids once a step)
        self.tokens: list[int] = []
        # token -> its positions in ``tokens`` (eq. 1's lookup, kept as it grows)
        self._where: dict[int, list[int]] = {}
        self.last_draft: list[int] = []  # the tokens the last get_candidates drafted (host list)
        self._eos = set() if eos_token_id is None else set(eos_token_id.reshape(-1).tolist())  # read once
        self.steps = 0  # drafting opportunities (calls after the prefill)
        self.drafted_steps = 0  # ... that proposed a draft
        self.drafted_tokens = 0

    # -- artifacts --------------------------------------------------------------------------------------------
    def _absorb(self, outputs, n: int) -> None:
        """Store the artifacts of the positions the last forward verified: ``0 .. n-2`` are final afterwards."""
        keep = n - 1 - self._stored
        if self.variant == "hidden":
            states = outputs.hidden_states[self.layer]
            if states is None or states.shape[1] < keep:
                raise RuntimeError("PLD+: the verification forward did not return the requested hidden state")
            rows = states[0, :keep].float()
            self._states[self._stored : self._stored + keep] = torch.nn.functional.normalize(rows, dim=-1)
        else:
            attentions = [a for a in (outputs.attentions or ()) if a is not None]
            if self.heads_only:
                if len(attentions) != len(self._layers):
                    raise RuntimeError(
                        "PLD+: the verification forward did not return the selected attentions"
                    )
                rows = attentions
            else:
                rows = [attentions[layer][:, self.heads[layer]] for layer in self._layers]
            self._rows = [r[0] for r in rows]  # (heads, rows, keys)
            self._row_offset = rows[0].shape[-1] - rows[0].shape[-2]
        self._stored = n - 1

    def extend(self, tokens: list[int]) -> None:
        """The tokens the loop emitted since the last call (the tree core passes ``StepFeedback.new_tokens``)."""
        for position, token in enumerate(tokens, start=len(self.tokens)):
            self._where.setdefault(token, []).append(position)
        self.tokens += tokens

    def _sync(self, input_ids: torch.Tensor) -> list[int]:
        """The host sequence, brought up to ``input_ids`` (one read of the tokens it lacks, if any)."""
        n = input_ids.shape[1]
        if len(self.tokens) > n:  # not this generation's sequence: read it whole
            self.tokens, self._where = [], {}
        if len(self.tokens) < n:
            self.extend(input_ids[0, len(self.tokens) :].tolist())
        return self.tokens

    def _rank(self, tokens: list[int]) -> tuple[int | None, float]:
        """Eq. 1 from the host index (positions ``j < t`` holding ``x_t``), ranked on the device in one read."""
        n = len(tokens)
        first = 1 if self.variant == "hidden" else 0  # j = 0 has no H_{j-1}
        occ = [j for j in self._where[tokens[-1]] if first <= j < n - 1]
        if not occ:
            return None, float("-inf")
        device = self._states.device if self.variant == "hidden" else self._rows[0].device
        occ = torch.tensor(occ, dtype=torch.long, device=device)
        if self.variant == "hidden":
            return rank_by_hidden(self._states[: n - 1], occ)
        row = n - 2 - self._row_offset  # x_{t-1} is position n-2
        rows = torch.cat([r[:, row, : n - 1] for r in self._rows], dim=0)
        return rank_by_attention(rows, occ)

    # -- CandidateGenerator API -------------------------------------------------------------------------------
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_kwargs: dict | None = None,
        model_outputs=None,
        is_first_iteration: bool = False,
        n_last_matches: int = 0,
        **kwargs,
    ) -> tuple[torch.LongTensor, None]:
        self._pending, self.last_draft = None, []
        if model_outputs is None:  # before the prefill: nothing to rank with yet
            return input_ids, None
        n = input_ids.shape[1]
        self._absorb(model_outputs, n)
        self.steps += 1
        tokens = self._sync(input_ids)
        if self._skipped is not None:  # scored against the token the target emitted there
            at, source, kind = self._skipped
            self.lengths.observe(kind, tokens[at] == tokens[source])
            self._skipped = None
        budget = self.max_length - n - 1  # the draft and the bonus token must fit
        if budget < 1:
            return input_ids, None
        j, score = self._rank(tokens)
        if j is None or (self.min_score is not None and score < self.min_score):
            return input_ids, None
        k = self.lengths.for_source(j, budget)
        if k < 1:
            self._skipped = (n, j + 1, self.lengths._last)
            return input_ids, None
        draft = tokens[j + 1 : min(j + 1 + k, n)]
        eos = next((i for i, t in enumerate(draft) if t in self._eos), None)
        if eos is not None:
            draft = draft[: eos + 1]
        self._pending = (n, j + 1, len(draft))
        self.last_draft = draft
        self.drafted_steps += 1
        self.drafted_tokens += len(draft)
        return torch.cat([input_ids, input_ids.new_tensor([draft])], dim=1), None

    def cut_draft(self, length: int) -> None:
        """The last draft was verified only up to its first ``length`` tokens (a batch cut it,
        ``core/batch_decoding.best_depth``): account for what was verified."""
        if self._pending is not None and length < self._pending[2]:
            out_start, src_start, _ = self._pending
            self._pending = (out_start, src_start, length)

    def update_candidate_strategy(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int
    ):
        """Record the copied-and-accepted span (App. D attribution). The token after the accepted draft tokens (the
        target's own, or an EOS the loop cut at) counts as copied too when it equals the source's next token."""
        if self._pending is None:
            self.lengths.update(None, 0, 0)
        else:
            out_start, src_start, drafted = self._pending
            self.lengths.update(src_start, drafted, int(num_matches))
            length = int(num_matches)
            after = out_start + length
            tokens = self._sync(input_ids)
            if after < len(tokens) and tokens[after] == tokens[src_start + length]:
                length += 1
            if length > 0:
                self.spans.append(CopiedSpan(out_start, src_start, length))
        self._pending = None
