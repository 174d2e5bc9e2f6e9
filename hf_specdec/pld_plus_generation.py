"""PLD+ (pld-plus.txt §4): prompt lookup whose occurrences are ranked with the target's own artifacts.

Prompt lookup decoding (PLD, transformers' ``prompt_lookup_num_tokens``) drafts the tokens that followed an
earlier n-gram match in the context. PLD+ matches only the last token ``x_t`` (eq. 1: the occurrences
``P = {j < t : x_j = x_t}``) and ranks the occurrences with what the verification forward already computed:

- ``pld_variant="hidden"`` (PLD+(h), §4.2.2, eq. 3): cosine similarity between the hidden states at layer ``l``
  of the tokens *before* the occurrence and before ``x_t``: ``cos(H_{j-1}, H_{t-1})``.
- ``pld_variant="attention"`` (PLD+(a), §4.2.1, eq. 2): the attention that ``x_{t-1}`` pays to ``x_j``, maxed
  over a set of induction heads (found once per model by ``hf-specdec find-heads``, see ``induction_heads.py``).

The draft (§4.3) is the ``K`` tokens after the best occurrence; no occurrence means no draft, so the step is a
plain decoding step. Verification (§4.4) is transformers' own assisted-decoding loop: greedy keeps the longest
prefix equal to the target's argmax, sampling samples each position from the target and keeps the prefix equal
to the draft (exactly the rules of HF prompt lookup), so the output is the target's, token for token
(greedy) or in distribution (sampling).

Names: ``K`` (``pld_num_tokens``) is the number of drafted tokens per step (the papers' gamma); tau is the number
of tokens produced per target forward; ``l`` (``pld_layer``) indexes ``output_hidden_states`` (0 = embeddings,
``i`` = output of decoder layer ``i``).

The artifacts come from the verification forward through transformers 5.x's ``requires_model_outputs`` /
``model_kwargs_overrides``: only hidden state ``l`` is requested (PLD+(h)); for PLD+(a) the attention of only the
selected heads is computed, next to the model's own (sdpa) attention, by a thin registered attention function
(``_attention_with_selected_weights``); the model's outputs are the unchanged ones of its own kernel. Hidden states
are kept incrementally: each step appends only the rows of the verified positions (rejected draft positions are
dropped), never recomputes them. Attention rows are read from the latest forward only (the row of ``x_{t-1}``
spans the whole context).

Attribution (App. D): with ``pld_return_attribution=True``, :func:`pld_plus` returns the context position every
copied-and-accepted span came from (:class:`CopiedSpan`).

Usage::

    out = target.generate(**inputs, custom_generate=hf_specdec.pld_plus, pld_variant="hidden", max_new_tokens=256)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .assisted import run_assisted_decoding
from .errors import SpecDecError
from .verify_cost import CostCurve, measured_cost

VARIANTS = {"hidden": "hidden", "h": "hidden", "attention": "attention", "a": "attention"}

# Defaults tuned on the `summarize` task only (`hf-specdec pld-tune`, docs/pld-plus.md "Tuning"): layer 14 of
# SmolLM2's 30 (stored as a fraction of the depth so that it transfers to other depths), adaptive K with the priors
# below, the top 10 heads, and a minimum score (App. B.3's threshold) below which a step does not draft: on a CPU a
# verification forward costs noticeably more per drafted token, so a low-confidence draft loses more than it wins.
DEFAULT_MAX_TOKENS = 64  # adaptive mode's cap on K (DraftLength)
# DraftLength's priors: hit rate of a fresh occurrence, hit rate of a running copy, continuation rate
DEFAULT_PRIORS = (0.4, 0.9, 0.85)
DEFAULT_LAYER_FRACTION = 14 / 30
DEFAULT_TOP_HEADS = 10
DEFAULT_MIN_SCORE = {"hidden": 0.8, "attention": 0.2}


@dataclass(frozen=True)
class CopiedSpan:
    """``length`` accepted output tokens at ``output_start`` were drafted from the context at ``source_start``.

    Both positions index ``sequences[0]`` (prompt included), so the span's text is
    ``sequences[0, output_start : output_start + length]`` and its source is
    ``sequences[0, source_start : source_start + length]``.
    """

    output_start: int
    source_start: int
    length: int


@dataclass
class PLDPlusGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``attribution``: the :class:`CopiedSpan` list (pld-plus.txt App. D)."""

    attribution: list[CopiedSpan] | None = None


# --------------------------------------------------------------------------------------------- ranking (eq. 1-3)
def occurrences(ids: torch.Tensor) -> torch.Tensor:
    """Eq. 1: positions ``j < t`` of the 1-D ``ids`` whose token equals the last one, ``x_t = ids[-1]``."""
    return (ids[:-1] == ids[-1]).nonzero().squeeze(1)


def rank_by_hidden(unit_states: torch.Tensor, occ: torch.Tensor) -> tuple[int | None, float]:
    """Eq. 3: the occurrence ``j`` maximising ``cos(H_{j-1}, H_{t-1})``.

    ``unit_states`` holds the L2-normalised layer-``l`` hidden states of positions ``0 .. t-1`` (one row each), so the
    cosine is a dot product; ``occ`` are the occurrences of ``x_t`` (``j = 0`` has no ``H_{j-1}`` and is skipped).
    Returns ``(j, similarity)`` or ``(None, -inf)``.
    """
    occ = occ[occ >= 1]
    if occ.numel() == 0:
        return None, float("-inf")
    sims = unit_states[occ - 1].float() @ unit_states[-1].float()
    best = int(sims.argmax())
    return int(occ[best]), float(sims[best])


def rank_by_attention(rows: torch.Tensor, occ: torch.Tensor) -> tuple[int | None, float]:
    """Eq. 2: the occurrence ``j`` with the largest attention from ``x_{t-1}``, maxed over the selected heads.

    ``rows`` is ``(num_selected_heads, t)``: each selected head's attention row of query ``x_{t-1}`` over keys
    ``0 .. t-1``. Returns ``(j, attention)`` or ``(None, -inf)``.
    """
    if occ.numel() == 0:
        return None, float("-inf")
    scores = rows[:, occ].amax(dim=0)
    best = int(scores.argmax())
    return int(occ[best]), float(scores[best])


@dataclass
class DraftLength:
    """``K`` per step (§4.3's K, chosen by expected time gain: an extension for CPUs, where drafted tokens cost).

    Fixed mode (``cost=None``): always ``max_k`` tokens, the paper's fixed ``K``.

    Adaptive mode: a copied draft is either wrong from its first token or right for a while, so acceptance is
    modelled in two parts: the first token is accepted with probability ``h`` (the *hit* rate), each later one, once
    the tokens before it were, with probability ``a`` (the *continuation* rate). A ``K``-token draft then yields
    ``E(K) = 1 + h (1 - a^K) / (1 - a)`` tokens (the target's own token included) for a forward costing ``c(K + 1)``
    one-token forwards (:class:`~hf_specdec.verify_cost.CostCurve`, measured on the running machine). The step
    drafts the ``K <= max_k`` maximising ``E(K) / c(K + 1)``, and nothing when no ``K`` beats a plain step
    (``E / c <= 1``). ``h`` is estimated online separately for a *fresh* occurrence and for a *running copy* (the
    best occurrence is exactly where the previous, fully accepted draft's copy continues), ``a`` over all drafts;
    each estimate starts from a prior worth ``weight`` observations. Priors come from the summarize tuning
    (``hf-specdec pld-tune``). A single geometric rate for all tokens (this class's first version) under-drafts the
    long, correct copies of edit tasks (docs/pld-plus.md, "Draft length").
    """

    max_k: int
    cost: CostCurve | None = None
    prior_fresh: float = DEFAULT_PRIORS[0]
    prior_run: float = DEFAULT_PRIORS[1]
    prior_continue: float = DEFAULT_PRIORS[2]
    weight: float = 8.0
    _continue_at: int | None = None
    # [successes, failures] of first tokens (fresh / run) and of later tokens ("continue")
    _counts: dict = field(default_factory=lambda: {"fresh": [0, 0], "run": [0, 0], "continue": [0, 0]})
    _last: str = "fresh"

    def acceptance(self, kind: str) -> float:
        """The current estimate of ``h`` (``kind`` ``"fresh"`` or ``"run"``) or of ``a`` (``"continue"``)."""
        good, bad = self._counts[kind]
        prior = {"fresh": self.prior_fresh, "run": self.prior_run, "continue": self.prior_continue}[kind]
        return (good + self.weight * prior) / (good + bad + self.weight)

    def for_source(self, j: int, budget: int | None = None) -> int:
        """Tokens to draft from occurrence ``j`` (``0``: do not draft); ``budget`` caps it."""
        cap = self.max_k if budget is None else min(self.max_k, budget)
        self._last = "run" if j == self._continue_at else "fresh"
        if self.cost is None or cap < 1:
            return max(cap, 0)
        h, a = self.acceptance(self._last), min(self.acceptance("continue"), 0.999)
        best_k, best_gain, expected, term = 0, 1.0, 1.0, h
        for k in range(1, cap + 1):
            expected += term  # + P(the k-th drafted token is accepted) = h a^(k-1)
            term *= a
            gain = expected / self.cost(k + 1)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def update(self, source_start: int | None, drafted: int, accepted: int) -> None:
        """After verification: ``accepted`` of the ``drafted`` tokens copied from ``source_start`` were kept."""
        if source_start is None or drafted == 0:
            self._continue_at = None
            return
        self._counts[self._last][0 if accepted else 1] += 1
        if accepted:
            cont = self._counts["continue"]
            cont[0] += accepted - 1
            cont[1] += int(accepted < drafted)
        self._continue_at = source_start + accepted if accepted >= drafted else None


# ------------------------------------------------------------------------------- selected-head attention capture
@dataclass
class _Capture:
    heads_by_layer: dict[int, torch.Tensor]  # layer index -> query-head indices whose weights are wanted
    last_rows: int | None = None  # compute only the last `last_rows` query rows (None: all)


_CAPTURE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("pld_plus_capture", default=None)
_WRAPPER_PREFIX = "pld_plus|"


def _selected_weights(
    module, query: torch.Tensor, key: torch.Tensor, scaling: float | None
) -> torch.Tensor | None:
    """Softmax attention of the selected heads of ``module`` (``None`` when none is selected there).

    Batch size 1 and no padding (assisted decoding's own restriction): query row ``i`` of ``q`` rows sits at key
    position ``k - q + i``, which gives the causal mask. Shape ``(1, heads, rows, keys)``, float32.
    """
    capture = _CAPTURE.get()
    if capture is None:
        return None
    heads = capture.heads_by_layer.get(getattr(module, "layer_idx", None))
    if heads is None:
        return None
    n_q, n_kv = query.shape[1], key.shape[1]
    rows = query.shape[2] if capture.last_rows is None else min(capture.last_rows, query.shape[2])
    heads = heads.to(query.device)
    q = query[:, heads, query.shape[2] - rows :].float()
    k = key[:, heads // (n_q // n_kv)].float()  # grouped-query attention: query head -> its key/value head
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    n_keys = k.shape[2]
    positions = torch.arange(n_keys - rows, n_keys, device=scores.device)
    future = torch.arange(n_keys, device=scores.device)[None, :] > positions[:, None]
    return scores.masked_fill_(future, float("-inf")).softmax(dim=-1)


def _make_attention(base: str):
    from transformers import AttentionInterface

    base_fn = AttentionInterface._global_mapping[base]

    def _attention_with_selected_weights(module, query, key, value, attention_mask, **kwargs):
        """The model's own ``base`` attention for the output, plus the selected heads' weights (or ``None``)."""
        kwargs.pop("output_attentions", None)  # the base kernel does not return weights; we do, below
        out, _ = base_fn(module, query, key, value, attention_mask, **kwargs)
        return out, _selected_weights(module, query, key, kwargs.get("scaling"))

    return _attention_with_selected_weights


def _register_wrapper(base: str) -> str:
    """Register ``pld_plus|<base>`` (attention and mask functions) once; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = _WRAPPER_PREFIX + base
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, _make_attention(base))
        if base in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[base])
    return name


@contextlib.contextmanager
def capture_selected_attention(
    model, heads_by_layer: dict[int, torch.Tensor], last_rows: int | None = None
) -> Iterator[bool]:
    """Within the block, ``output_attentions=True`` returns the attention weights of the selected heads only.

    A model on ``eager`` attention already computes every weight; it is left as it is (yields ``False``: its
    ``outputs.attentions`` holds all layers and heads). Otherwise the model's attention implementation ``X`` is
    switched to ``pld_plus|X`` for the block: ``X`` itself computes the layer outputs (so generation is unchanged),
    and the selected heads' weights are computed next to it (yields ``True``: ``outputs.attentions`` holds one
    ``(1, len(heads), rows, keys)`` tensor per selected layer, in layer order).
    """
    from transformers import AttentionInterface

    base = model.config._attn_implementation
    if base == "eager":
        yield False
        return
    if base.startswith(_WRAPPER_PREFIX):
        raise SpecDecError("capture_selected_attention cannot be nested on the same model")
    if base not in AttentionInterface._global_mapping:
        raise SpecDecError(
            f"PLD+(a) cannot read attention weights from attn_implementation={base!r}; "
            "load the model with attn_implementation='sdpa' or 'eager'"
        )
    token = _CAPTURE.set(_Capture(heads_by_layer, last_rows))
    model.set_attn_implementation(_register_wrapper(base))
    try:
        yield True
    finally:
        model.set_attn_implementation(base)
        _CAPTURE.reset(token)


# ---------------------------------------------------------------------------------------- candidate generator
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
    """PLD+ drafting (pld-plus.txt §4.2-4.3) as a transformers ``CandidateGenerator``.

    It asks the assisted-decoding loop for the verification forward's outputs (``requires_model_outputs``) with
    ``model_kwargs_overrides`` = hidden state ``l`` only (PLD+(h)) or the attentions (PLD+(a), see
    :func:`capture_selected_attention`). The first call happens before the prefill has run: it proposes nothing, so
    the prefill is the ordinary first forward.

    Args:
        variant: ``"hidden"`` or ``"attention"``.
        num_draft_tokens: ``K``, the most tokens drafted per step.
        cost: the measured verification cost curve; with it ``K`` adapts per step (:class:`DraftLength`), without
            it every draft has ``K`` tokens.
        priors: :class:`DraftLength`'s prior hit rates (fresh occurrence, running copy) and continuation rate.
        hidden_size / max_length: size the incremental hidden-state store (PLD+(h)).
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
        self.max_length = max_length
        self.layer = layer
        self.heads = heads or {}
        self.heads_only = heads_only
        self.eos_token_id = eos_token_id
        self.min_score = min_score
        if variant == "hidden":
            if layer is None or hidden_size is None:
                raise SpecDecError("PLD+(h) needs the hidden-state layer and the hidden size")
            self.model_kwargs_overrides: dict[str, Any] = {"output_hidden_states": [layer]}
            self._states = torch.empty(max_length, hidden_size, dtype=torch.float32)
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

    def _rank(self, ids: torch.Tensor) -> tuple[int | None, float]:
        occ = occurrences(ids)
        if occ.numel() == 0:
            return None, float("-inf")
        n = ids.shape[0]
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
        self._pending = None
        if model_outputs is None:  # before the prefill: nothing to rank with yet
            return input_ids, None
        n = input_ids.shape[1]
        self._absorb(model_outputs, n)
        self.steps += 1
        budget = self.max_length - n - 1  # the draft and the bonus token must fit
        if budget < 1:
            return input_ids, None
        ids = input_ids[0]
        j, score = self._rank(ids)
        if j is None or (self.min_score is not None and score < self.min_score):
            return input_ids, None
        k = self.lengths.for_source(j, budget)
        if k < 1:
            return input_ids, None
        draft = ids[j + 1 : min(j + 1 + k, n)]
        if self.eos_token_id is not None:
            eos = torch.isin(draft, self.eos_token_id.to(draft.device)).nonzero()
            if eos.numel():
                draft = draft[: int(eos[0]) + 1]
        self._pending = (n, j + 1, draft.shape[0])
        self.drafted_steps += 1
        self.drafted_tokens += draft.shape[0]
        return torch.cat([input_ids, draft[None].to(input_ids.device)], dim=1), None

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
            if after < input_ids.shape[1] and int(input_ids[0, after]) == int(
                input_ids[0, src_start + length]
            ):
                length += 1
            if length > 0:
                self.spans.append(CopiedSpan(out_start, src_start, length))
        self._pending = None


def merge_spans(spans: list[CopiedSpan]) -> list[CopiedSpan]:
    """Join consecutive spans that continue the same source (a long copy verified over several steps)."""
    merged: list[CopiedSpan] = []
    for span in spans:
        if merged:
            last = merged[-1]
            if (
                span.output_start == last.output_start + last.length
                and span.source_start == last.source_start + last.length
            ):
                merged[-1] = CopiedSpan(last.output_start, last.source_start, last.length + span.length)
                continue
        merged.append(span)
    return merged


# ------------------------------------------------------------------------------------------ custom_generate
def _heads_for(model, heads_file: str | Path | None, top_heads: int | None) -> dict[int, torch.Tensor]:
    from .induction_heads import default_heads_file, read_heads_file

    path = heads_file if heads_file is not None else default_heads_file(model)
    heads = read_heads_file(path, model=model, top=top_heads or DEFAULT_TOP_HEADS)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    return {layer: torch.tensor(sorted(hs), dtype=torch.long) for layer, hs in by_layer.items()}


def pld_plus(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    pld_variant: str = "hidden",
    pld_num_tokens: int | None = None,
    pld_max_num_tokens: int | None = None,
    pld_layer: int | None = None,
    pld_heads: str | Path | None = None,
    pld_top_heads: int | None = None,
    pld_min_score: float | None = None,
    pld_cost: CostCurve | None = None,
    pld_priors: tuple[float, float, float] | None = None,
    pld_return_attribution: bool = False,
    pld_streamer=None,
    **model_kwargs,
):
    """``custom_generate`` for PLD+: ``model.generate(**inputs, custom_generate=hf_specdec.pld_plus, ...)``.

    Every ``generate`` argument works as usual (``max_new_tokens``, ``do_sample``, ``temperature``, ``top_p``,
    ``streamer``, ``return_dict_in_generate`` ...); batch size 1, like all of transformers' assisted decoding.

    Args:
        pld_variant: ``"hidden"`` (PLD+(h), default) or ``"attention"`` (PLD+(a)).
        pld_num_tokens: a fixed ``K``, tokens drafted per step (the paper's §4.3). Default: adaptive, each step
            drafts the ``K`` with the best expected time gain on this machine (:class:`DraftLength`).
        pld_max_num_tokens: adaptive mode's largest ``K`` (default :data:`DEFAULT_MAX_TOKENS`).
        pld_cost: adaptive mode's verification cost curve (:class:`~hf_specdec.verify_cost.CostCurve`); default:
            measured once on this machine (a dozen timed forwards on the first call, then cached on the model).
        pld_priors: adaptive mode's prior hit rates of a fresh occurrence and of a running copy, and continuation rate
            (default :data:`DEFAULT_PRIORS`, from the summarize tuning).
        pld_layer: PLD+(h)'s hidden-state index ``l`` (default: :data:`DEFAULT_LAYER_FRACTION` of the depth).
        pld_heads: PLD+(a)'s heads file (``hf-specdec find-heads``); default: the shipped file of the default
            target.
        pld_top_heads: how many of the file's top-ranked heads PLD+(a) uses (default :data:`DEFAULT_TOP_HEADS`).
        pld_min_score: no draft when the best occurrence scores below this (cosine for (h), attention for (a));
            default :data:`DEFAULT_MIN_SCORE`, ``-1`` turns it off.
        pld_return_attribution: return a :class:`PLDPlusGenerateOutput` whose ``attribution`` lists, for every
            copied-and-accepted span, the context position it was copied from (App. D).
        pld_streamer: a streamer (``TextStreamer`` ...). transformers 5.23's ``generate`` does not hand its own
            ``streamer=`` to a ``custom_generate`` callable (it only puts the prompt into it), so pass it here.
    """
    variant = VARIANTS.get(str(pld_variant).lower())
    if variant is None:
        raise SpecDecError(f"pld_variant must be 'hidden' or 'attention', got {pld_variant!r}")
    if input_ids.shape[0] != 1:
        raise SpecDecError("PLD+ (like transformers' assisted decoding) generates for one sequence at a time")
    if pld_priors is not None and len(tuple(pld_priors)) != 3:
        raise SpecDecError(
            "pld_priors takes three probabilities: the hit rate of a fresh occurrence, of a running copy, and the "
            f"continuation rate (default {DEFAULT_PRIORS}); got {pld_priors!r}"
        )
    if pld_streamer is not None:
        pld_streamer.put(input_ids.cpu())  # what generate does with its own streamer before decoding
        streamer = pld_streamer
    if pld_num_tokens is not None:
        k, cost = pld_num_tokens, None
    else:
        k = DEFAULT_MAX_TOKENS if pld_max_num_tokens is None else pld_max_num_tokens
        cost = pld_cost if pld_cost is not None else measured_cost(model, input_ids[0])
    common = dict(
        num_draft_tokens=k,
        max_length=generation_config.max_length,
        eos_token_id=getattr(generation_config, "_eos_token_tensor", None),
        min_score=DEFAULT_MIN_SCORE[variant] if pld_min_score is None else float(pld_min_score),
        cost=cost,
        priors=DEFAULT_PRIORS if pld_priors is None else tuple(pld_priors),
    )
    if variant == "hidden":
        generator = PLDPlusCandidateGenerator(
            "hidden",
            layer=resolve_layer(model, pld_layer),
            hidden_size=model.config.get_text_config().hidden_size,
            **common,
        )
        capture = contextlib.nullcontext(True)
    else:
        heads = _heads_for(model, pld_heads, pld_top_heads)
        capture = capture_selected_attention(model, heads, last_rows=k + 1)
        generator = None
    with capture as heads_only:
        if generator is None:
            generator = PLDPlusCandidateGenerator("attention", heads=heads, heads_only=heads_only, **common)
        out = run_assisted_decoding(
            model,
            generator,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )
    if not pld_return_attribution:
        return out
    spans = merge_spans(generator.spans)
    if isinstance(out, torch.Tensor):
        return PLDPlusGenerateOutput(sequences=out, attribution=spans)
    return PLDPlusGenerateOutput(**dict(out.items()), attribution=spans)
