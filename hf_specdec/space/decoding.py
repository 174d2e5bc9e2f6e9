"""SPACE auto-correct decoding (space.txt §3.2, Alg. 1, eq. 4-7, Fig. 7) as a ``custom_generate`` loop.

A model fine-tuned with SAR-SFT (``hf-specdec train space``) predicts, at a group of ``k`` mask tokens
``[M]`` placed after its last real token, the tokens 2..k+1 places ahead. One forward per step then both
*verifies* the k candidates of the previous step and *drafts* the next k (eq. 4)::

    I = x_1 .. x_l, [M]*k, c_1, [M]*k, c_2, ..., c_k, [M]*k

- attention (eq. 5, Fig. 7): a real token sees every earlier real token and no mask; a mask sees the earlier
  real tokens and the earlier masks *of its own group*. Eq. 5's ``i - j < k`` test is that rule for k <= 2;
  for larger k it would let a group see the tail of the previous one, so the group rule of §3.2/App. A.3
  ("mask tokens within their respective groups") is what is implemented (identical to Fig. 7 for k = 2);
- positions ``P_i = sum_j A_ij - 1``: real tokens get their sequence position, mask ``j`` of a group gets
  ``(position of the real token before it) + j``, exactly as in training (``trainers/space_collator.py``);
- verification (Alg. 1, eq. 6-7): ``Q`` at ``x_l`` scores ``c_1``, ``Q`` at ``c_i`` scores ``c_{i+1}``.
  Greedy: ``c_i`` is accepted iff it is the argmax of ``Q``. Sampling: accepted with probability
  ``min(1, Q(c_i) / P_c(c_i))`` where ``P_c`` is the mask distribution ``c_i`` was drawn from (eq. 6); on
  rejection one token is drawn from ``normalize(max(Q - P_c, 0))`` (Leviathan et al.; Alg. 1 line 18 draws
  from ``Q``, which would not keep the target distribution), else a bonus token from the last ``Q``. That is the
  tree core's acceptance (``core/acceptance.py``) on the chain ``c_1 -> ... -> c_k`` with ``q = P_c``, so SPACE
  verifies through it: one verifier for every method;
- the next candidates come from the mask group after the last accepted token (group ``i*``);
- the KV cache keeps only the real accepted tokens (``core.kv_cache.compact_cache``): real tokens never attend
  to masks and have contiguous positions, so their entries equal those of plain decoding.

Paper names: ``k`` = number of masks (= candidates per step), ``tau`` = tokens per forward ("average
accepted tokens" in the paper, bonus counted). With ``num_masks < k`` only the first masks of each group
are fed (a mask sees only earlier masks of its group, so a shorter group is still exact): a cheaper step. A
step feeds ``1 + n(n+2)`` tokens for ``n`` masks (36 at n = 5, 4 at n = 1); where later masks are rarely accepted
the cheaper step wins, which is why the shipped adapter decodes with ``space_num_masks = 1`` (docs/space.md).

Use ``model.generate(**inputs, custom_generate=hf_specdec.space, max_new_tokens=...)`` (``hf_specdec.space`` is
:func:`space_generate`).
"""

from __future__ import annotations

import itertools
import math
import operator

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..core.acceptance import accept_tree, processed_scores
from ..core.draft_budget import DraftBudget, DraftGate, shared_gate
from ..core.generate_io import (
    NO_MAX_LENGTH,
    GenerateOutputs,
    StopRule,
    check_generation_mode,
    check_inputs,
    finish,
    logits_to_keep,
    prepare_cache,
    resolve_streamer,
    stopping_criteria_or_default,
)
from ..core.kv_cache import compact_cache
from ..core.sliding_window import LayerMasks
from ..core.stats import DecodeStats
from ..core.timing import clock, untimed
from ..core.tree import TokenTree, host_to_device
from ..core.verify_cost import CostCurve, CostObserver, measured_cost
from ..errors import SpecDecError


# ------------------------------------------------------------------------------------------ eq. 4, 5
def build_input(real_ids: list[int], candidates: list[int], k: int, mask_token_id: int) -> list[int]:
    """Eq. 4: the real tokens, then ``len(candidates) + 1`` groups of ``k`` masks with a candidate between
    consecutive groups."""
    ids = list(real_ids) + [mask_token_id] * k
    for c in candidates:
        ids += [int(c)] + [mask_token_id] * k
    return ids


def attention_mask(is_mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5 / Fig. 7 as a boolean ``(n, n)`` matrix (True = may attend) for a 1D boolean ``is_mask``.

    ``A[i, j]`` is True iff ``j <= i`` and either ``j`` is a real token, or ``i`` and ``j`` are masks of the
    same group (a maximal run of consecutive masks)."""
    is_mask = is_mask.bool()
    n = is_mask.shape[0]
    starts = is_mask & ~torch.cat([is_mask.new_zeros(1), is_mask[:-1]])
    group = torch.cumsum(starts.long(), 0)
    causal = torch.ones(n, n, dtype=torch.bool, device=is_mask.device).tril()
    same_group = is_mask[:, None] & is_mask[None, :] & (group[:, None] == group[None, :])
    return causal & (~is_mask[None, :] | same_group)


def positions(mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """``P_i = sum_j A_ij - 1`` (+ ``offset`` cached real tokens, which every row sees)."""
    return mask.long().sum(-1) - 1 + offset


# ------------------------------------------------------------------------------------------ cost-sized candidates
class _StepWidth:
    """``c`` of a SPACE step verifying ``q - 1`` candidates with ``k`` masks per group: it feeds
    ``1 + (q - 1) + q k`` tokens (eq. 4), on the model's measured curve (``core/verify_cost.py``)."""

    def __init__(self, curve: CostCurve, k: int):
        self.curve, self.k = curve, k
        self.needs_plain = curve.needs_plain

    def __call__(self, q: int) -> float:
        return self.curve(1 + (q - 1) + q * self.k)


def candidate_budget(
    model, input_ids: torch.Tensor, k: int, space_cost: bool | CostCurve
) -> DraftBudget | None:
    """The :class:`~hf_specdec.core.draft_budget.DraftBudget` of SPACE's candidates (issue #31 point 3): a candidate
    is verified while its estimate (the product of the mask confidences along the chain) pays for the ``k + 1``
    tokens it adds to the next step; drafting costs nothing apart (the masks ride in the same forward), and a step
    with no candidate still costs ``c(1 + k)``, counted as the "drafter" cost of :meth:`DraftBudget.keep`."""
    if space_cost is False or space_cost is None:
        return None
    curve = space_cost if isinstance(space_cost, CostCurve) else measured_cost(model, input_ids[0])
    return _CandidateBudget(_StepWidth(curve, k))


class _CandidateBudget(DraftBudget):
    """:class:`DraftBudget` whose "drafter" cost is the masks' width, ``c(1 + k) - 1``, read from the curve as it
    is learnt."""

    @property
    def drafter_cost(self) -> float:
        return self.cost(1) - 1.0

    @drafter_cost.setter
    def drafter_cost(self, value: float) -> None:  # DraftBudget.__init__'s; the width decides
        pass


# ------------------------------------------------------------------------------------------ Alg. 1
def _space_config(model, num_masks: int | None, mask_token_id: int | None) -> tuple[int, int]:
    """``(masks per group, mask token id)``: ``num_masks`` if given, else the model's measured decoding default
    ``config.space_num_masks`` (a shipped adapter's card sets it, ``load_space_model``), else the trained ``k``."""
    k_default = getattr(model.config, "space_num_masks", None) or getattr(model.config, "space_k", None)
    mask_id = (
        mask_token_id if mask_token_id is not None else getattr(model.config, "space_mask_token_id", None)
    )
    if mask_id is None or (num_masks is None and k_default is None):
        raise SpecDecError(
            "this model was not trained for SPACE (config has no space_mask_token_id / space_k); "
            "fine-tune it with `hf-specdec train space` or pass mask_token_id= and num_masks="
        )
    k = int(num_masks if num_masks is not None else k_default)
    if k < 1:
        raise SpecDecError(f"num_masks must be at least 1 (got {k})")
    return k, int(mask_id)


def space_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    synced_gpus: bool = False,
    streamer=None,
    num_masks: int | None = None,
    mask_token_id: int | None = None,
    stats: DecodeStats | None = None,
    space_generator: torch.Generator | None = None,
    specdec_streamer=None,
    space_cost: bool | CostCurve = True,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """``custom_generate`` loop of SPACE auto-correct decoding (Alg. 1), batch size 1.

    ``num_masks`` (default ``config.space_num_masks``, else ``config.space_k``) masks per group; ``mask_token_id`` defaults to
    ``config.space_mask_token_id``. ``stats`` (a ``DecodeStats``) is filled with forwards / drafted /
    accepted counts. Greedy or sampling follows ``generation_config.do_sample``; processors (temperature,
    top-k/p, penalties) are applied to every distribution with the exact prefix a plain loop would have.
    ``specdec_streamer``: a streamer fed the prompt, then every emitted token (``core/generate_io.py``).
    ``space_cost`` (default True): verify only the candidates that pay for the width they add on this machine's
    learnt cost curve (:func:`candidate_budget`), and feed the masks only while drafting has been paying
    (``core/draft_budget.DraftGate``: else plain one-token steps with a probe now and then); False: every mask and
    candidate, every step (the paper); a ``CostCurve``: that curve.
    """
    tick = clock if stats is not None else untimed  # no device sync for timings nobody asked for
    t_start = tick(input_ids.device)
    check_generation_mode(generation_config or model.generation_config, "SPACE decoding")
    check_inputs(model, input_ids, model_kwargs, synced_gpus, "SPACE decoding")
    k, mask_id = _space_config(model, num_masks, mask_token_id)
    cfg = generation_config or model.generation_config
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    stopping_criteria = stopping_criteria_or_default(stopping_criteria, cfg)
    stop = StopRule(stopping_criteria)  # built once: checked on the host where it can be
    streamer = resolve_streamer(input_ids, streamer, specdec_streamer)
    stats = stats if stats is not None else DecodeStats()
    do_sample = bool(cfg.do_sample)
    outputs = GenerateOutputs(cfg, kinds=("scores",))
    max_length = cfg.max_length if cfg.max_length is not None else NO_MAX_LENGTH
    device = input_ids.device
    gen = space_generator
    budget = candidate_budget(model, input_ids, k, space_cost)
    # Masks only while they pay (issue #31 point 3): a step feeds its mask groups when drafting has been paying
    # (core/draft_budget.DraftGate), else it is a plain step (k = 0: no mask, no new candidate) but for probes. The
    # first candidate of every step that drafted is scored for free against the token the target emits next (it is
    # that token's argmax under greedy: a hit is an acceptance), verified or not; a step verifying one candidate with
    # its masks costs budget.cost(2). With the measured costs the gate is kept on the model across generations.
    gate = None if budget is None else shared_gate(model, model) if space_cost is True else DraftGate()
    # the last mask group's first candidate, its confidence, and whether that step was a probe
    first: tuple[int, float, bool] | None = None
    cache, past = prepare_cache(model, input_ids, model_kwargs)
    prompt_past = past  # what the caller's cache held: the first forward (the prefill) starts there
    masks = LayerMasks(model)  # sliding-window layers see their window (core/sliding_window.py)
    observer = CostObserver(model, input_ids.shape[1])  # learns c(q) from the steps (core/verify_cost.py)

    cands: list[int] = []  # L_c
    cand_probs: list[torch.Tensor] = []  # P_c as full distributions (sampling only)
    sequence = input_ids[0].tolist()  # the sequence on the host (read once; then extended by what is emitted)
    finished = False
    while not finished:
        # real tokens not in the cache: the prompt, then the bonus token
        pending = sequence[past:]
        room = max_length - input_ids.shape[1]  # tokens still allowed; the bonus token takes one
        plain = budget is not None and budget.cost.needs_plain()  # a t(1) sample for the learnt c(q)
        c = 0 if plain else max(0, min(len(cands), room - 1))
        ks = k if not plain and (gate is None or gate.draft_now()) else 0  # masks per group this step
        ids = build_input(pending, cands[:c], ks, mask_id)
        mask_flags = [int(j >= len(pending) and (j - len(pending)) % (ks + 1) != ks) for j in range(len(ids))]
        fed_ids, is_mask = host_to_device([ids, mask_flags], device)  # one copy: the ids and which are masks
        is_mask = is_mask.bool()
        local = attention_mask(is_mask)
        full = torch.cat([torch.ones(len(ids), past, dtype=torch.bool, device=device), local], dim=1)
        rows = len(ids) - len(pending) + 1  # rows from x_l on
        fed_positions = positions(local, past)[None]
        t0, mark = tick(device), observer.start()
        out = model(
            input_ids=fed_ids[None],
            position_ids=fed_positions,
            attention_mask=masks.after_prefix(full[None, None], fed_positions, past),
            past_key_values=cache,
            use_cache=True,
            return_dict=True,
            **logits_to_keep(model, rows),
        )
        verify_s = tick(device) - t0
        if past > prompt_past:  # not the prefill: a verification forward, a sample of t(len(ids))
            observer.stop(len(ids), mark)
        logits = out.logits[0, -rows:]  # row 0 = x_l
        del out

        # Verify c_1..c_c (row (i-1)(ks+1) scores c_i), then one token of the model's own: the chain c_1 -> c_2 ...
        # through the tree core's acceptance, with q = P_c when sampling.
        chain = TokenTree.from_chain(  # from the host list: nothing read back
            cands[:c], torch.stack(cand_probs[:c]) if do_sample and c else None, device=device
        )
        acc = accept_tree(chain, logits[:: ks + 1][: c + 1], input_ids, logits_processor, do_sample, gen)
        tokens, n_acc = acc.tokens, len(acc.nodes)
        row = n_acc * (ks + 1)  # the row of the last accepted real token
        if gate is not None and first is not None:  # the free score of the last drafted first candidate
            hit = float(tokens[0] == first[0])
            gate.outcome(first[1], hit, 1.0 + hit, budget.cost(2), probe=first[2])

        # New candidates from the mask group after the last accepted token (group n_acc), drawn after the bonus.
        cands, confidence, cand_probs = [], [], []
        if ks:
            seq = torch.cat([input_ids, input_ids.new_tensor([tokens])], dim=-1)
            group = logits[row + 1 : row + 1 + ks]
            gs = torch.cat([processed_scores(logits_processor, seq, g) for g in group])
            if do_sample:
                cand_probs = list(torch.softmax(gs, dim=-1))
                cands = [int(torch.multinomial(p, 1, generator=gen)) for p in cand_probs]
                # by the distributions only: a candidate kept or dropped by the value drawn would bias the sampling
                confidence = torch.stack(cand_probs).max(-1).values.tolist() if budget else []
            else:
                best = gs.float().log_softmax(-1).max(-1)  # one read: the candidates and their confidences
                ids_and_logp = torch.stack([best.indices.float(), best.values]).tolist()
                cands, confidence = [int(t) for t in ids_and_logp[0]], ids_and_logp[1]
                confidence = [math.exp(v) for v in confidence]
        first = (cands[0], confidence[0], gate.probing) if cands and gate is not None else None
        if budget and cands:  # a prefix: the chain's estimates only fall
            scale = gate.estimate_scale
            estimates = [min(e * scale, 1.0) for e in itertools.accumulate(confidence, operator.mul)]
            cands = cands[: len(budget.keep(estimates, list(range(len(cands)))))]

        input_ids, finished = stop.append(input_ids, tokens)
        m = input_ids.shape[1] - past - len(pending)  # tokens emitted this step (a stop may cut them)
        sequence += tokens[:m]
        kept = min(n_acc, m)
        keep = list(range(len(pending))) + [len(pending) - 1 + j * (ks + 1) for j in range(1, kept + 1)]
        compact_cache(cache, past, keep)
        past += len(keep)
        outputs.add(acc.scores[:m])
        if streamer is not None:
            streamer.put(input_ids[0, -m:].cpu())
        stats.target_forwards += 1
        stats.drafted += c
        stats.accepted += n_acc
        stats.verify_time += verify_s
        stats.steps.append(
            dict(drafted=c, accepted=n_acc, new_tokens=m, fed=len(ids), masks=ks, verify_s=verify_s)
        )

    observer.finish()
    finish(stats, streamer, t_start, input_ids.device, tick)
    stats.draft_time = max(stats.total_time - stats.verify_time, 0.0)
    return outputs.result(input_ids, cache)
