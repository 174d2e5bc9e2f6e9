"""SPACE auto-correct decoding as a proposer of the tree core: Yi et al., "Generation Meets Verification:
Accelerating Large Language Model Inference with Smart Parallel Auto-Correct Decoding" (arXiv:2402.11809), §3.2,
Alg. 1, eq. 4-7, Fig. 7.

A model fine-tuned with SAR-SFT (``hf-specdec train space``) predicts, at a group of ``k`` mask tokens ``[M]``
placed after a real token, the tokens 2..k+1 places ahead. One forward per step then both *verifies* the
candidates of the previous step and *drafts* the next ones (eq. 4)::

    I = x_l, [M]*k, c_1, [M]*k, c_2, ..., c_c, [M]*k

That input is a token tree below the root ``x_l`` (:func:`space_tree`): the candidates form a chain, and every real
token of it (the root included) carries a branch of ``k`` masks, mask ``j`` the child of mask ``j - 1``. The tree
core's tree attention then gives exactly eq. 5 / Fig. 7 (a mask sees the real tokens before it and the earlier
masks of its own group, a real token no mask) and its tree positions eq. 5's ``P_i = sum_j A_ij - 1`` (mask ``j``
of a group sits ``j`` places after its real token, as in training, ``trainers``' SAR-SFT collator).

Verification is the tree core's (``core/acceptance.py``), so it is Alg. 1's greedy match, or, when sampling,
speculative sampling with ``q = P_c`` the mask distribution a candidate was drawn from (eq. 6; on rejection the
residual ``normalize(max(Q - P_c, 0))``, which keeps the target's distribution where Alg. 1 line 18's draw from
``Q`` would not). A mask branch is a draft of literal ``[M]`` tokens: the forward computes at mask ``j`` exactly
what the model computes for ``x, [M] * j``, so accepting one where the model's own next token is ``[M]`` is
lossless too. The cache keeps the accepted path only: real tokens never see masks, so their entries equal plain
decoding's. The next candidates come from the mask group below the last accepted real token, read from the
step's logits (``StepFeedback.logits``). The prefill feeds no mask, so the first step drafts the first group.

Paper names: ``k`` = masks per group, ``tau`` = tokens per forward (bonus counted). With ``num_masks < k`` only
the first masks of each group are fed (a mask sees only earlier masks of its group, so a shorter group is still
exact): a cheaper step. A step verifying ``c`` candidates feeds ``1 + c + (c + 1) n`` tokens for ``n`` masks.

Use ``model.generate(**inputs, custom_generate=hf_specdec.space, max_new_tokens=...)`` (``hf_specdec.space`` is
:func:`space_generate`); a left-padded batch with its ``attention_mask`` decodes every row in each forward.
"""

from __future__ import annotations

import itertools
import operator

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..core.acceptance import processed_scores
from ..core.draft_budget import DraftBudget, DraftGate, shared_gate
from ..core.generate_io import check_generation_mode, check_prompt, first_row
from ..core.proposer import StepFeedback, TreeProposer
from ..core.stats import DecodeStats
from ..core.tree import ROOT, TokenTree, host_to_device
from ..core.tree_decoding import tree_generate
from ..core.verify_cost import CostCurve, measured_cost
from ..errors import SpecDecError


def space_tree(candidates: list[int], k: int, mask_token_id: int, draft_probs=None, device=None) -> TokenTree:
    """Eq. 4 as a tree: the chain ``c_1 -> ... -> c_c`` below the root, each real token followed by its group of
    ``k`` masks, in eq. 4's order (root's group, ``c_1``, its group, ...). ``draft_probs``: ``(c, vocab)``, the
    distributions the candidates were drawn from (their masks get one-hot rows)."""
    tokens, parents, real = [], [], ROOT
    for i in range(len(candidates) + 1):
        below = real
        for _ in range(k):
            tokens.append(mask_token_id)
            parents.append(below)
            below = len(tokens) - 1
        if i < len(candidates):
            tokens.append(int(candidates[i]))
            parents.append(real)
            real = len(tokens) - 1
    probs = None
    if draft_probs is not None and len(candidates):
        probs = torch.zeros(len(tokens), draft_probs.shape[-1], device=draft_probs.device)
        probs[:, mask_token_id] = 1.0
        chain = host_to_device([(i + 1) * (k + 1) - 1 for i in range(len(candidates))], probs.device)
        probs[chain] = draft_probs.to(probs)
    return TokenTree(tokens, parents, probs, device)


class _StepWidth:
    """``c`` of a SPACE step verifying ``q - 1`` candidates with ``k`` masks per group: it feeds
    ``1 + (q - 1) + q k`` tokens (eq. 4), on the model's measured curve (``core/verify_cost.py``)."""

    def __init__(self, curve: CostCurve, k: int):
        self.curve, self.k = curve, k
        self.needs_plain = getattr(curve, "needs_plain", lambda: False)

    def __call__(self, q: int) -> float:
        return self.curve(1 + (q - 1) + q * self.k)


class _CandidateBudget(DraftBudget):
    """:class:`DraftBudget` of SPACE's candidates: a candidate is verified while its estimate (the product of the mask
    confidences along the chain) pays for the ``k + 1`` tokens it adds to the step; the masks ride in the same
    forward, and a step with no candidate still costs ``c(1 + k)``, counted as the "drafter" cost, read from the
    curve as it is learnt."""

    @property
    def drafter_cost(self) -> float:
        return self.cost(1) - 1.0

    @drafter_cost.setter
    def drafter_cost(self, value: float) -> None:  # DraftBudget.__init__'s; the width decides
        pass


def candidate_budget(model, context: torch.Tensor, k: int, space_cost: bool | CostCurve, rows: int = 1):
    """The budget of SPACE's candidates (``None``: every candidate, the paper's rule): on the learnt curve of
    ``model`` for a batch of ``rows`` (``space_cost=True``), or on a given ``CostCurve``."""
    if space_cost is False or space_cost is None:
        return None
    curve = space_cost if isinstance(space_cost, CostCurve) else measured_cost(model, context, batch=rows)
    return _CandidateBudget(_StepWidth(curve, k), rows=rows)


class SpaceProposer(TreeProposer):
    """SPACE's drafts for the tree core: each step the candidates read from the last step's mask group (a chain)
    with a mask group after every real token (:func:`space_tree`).

    ``budget`` (optional): verify only the candidates that pay for the width they add (:class:`_CandidateBudget`).
    ``gate`` (optional): feed the masks only while drafting has been paying (``core/draft_budget.DraftGate``; else
    plain one-token steps with a probe now and then). The first candidate of every drafted group is scored for free
    against the token the target emits next (under greedy, exactly its acceptance), verified or not."""

    def __init__(
        self,
        k: int,
        mask_token_id: int,
        logits_processor: LogitsProcessorList | None = None,
        do_sample: bool = False,
        budget: DraftBudget | None = None,
        gate: DraftGate | None = None,
    ):
        self.k, self.mask_token_id = k, mask_token_id
        self.logits_processor, self.do_sample = logits_processor, do_sample
        self.budget, self.gate = budget, gate

    def start(self, model, input_ids, generation_config) -> None:
        self.candidates: list[int] = []
        self.probs: torch.Tensor | None = None  # P_c of the candidates (sampling)
        self.first: tuple[int, float, bool] | None = (
            None  # first candidate, its confidence, drafted on a probe
        )
        self.groups: dict[
            int, tuple[int, int]
        ] = {}  # real node (ROOT included) -> (first mask's node, masks)

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        plain = (
            self.budget is not None and self.budget.cost.needs_plain()
        )  # a t(1) sample for the learnt c(q)
        c = 0 if plain else max(0, min(len(self.candidates), max_depth))
        ks = self.k if not plain and (self.gate is None or self.gate.draft_now()) else 0
        probs = self.probs[:c] if self.probs is not None and c else None
        tree = space_tree(self.candidates[:c], ks, self.mask_token_id, probs, input_ids.device)
        self.candidates, self.probs = [], None
        # real node -> (its first mask's node, masks), in the tree as verified: cut to max_depth, which re-indexes
        keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]
        node = {ROOT: ROOT, **{old: new for new, old in enumerate(keep)}}
        groups = [(ROOT, 0)] + [((i + 1) * (ks + 1) - 1, (i + 1) * (ks + 1)) for i in range(c)] if ks else []
        self.groups = {
            node[real]: (node[start], sum(start + j in node for j in range(ks)))
            for real, start in groups
            if real in node and start in node
        }
        return tree.subset(keep) if len(keep) < len(tree) else tree

    def observe(self, feedback: StepFeedback) -> None:
        if (
            self.gate is not None and self.first is not None
        ):  # the free score of the last group's first candidate
            token, confidence, probe = self.first
            hit = float(feedback.new_tokens[0] == token)
            self.gate.outcome(confidence, hit, 1.0 + hit, self.budget.cost(2), probe=probe)
        self.first = None
        last = feedback.accepted_nodes[-1] if feedback.accepted_nodes else ROOT
        start, masks = self.groups.get(
            last, (0, 0)
        )  # none: no masks fed, or the path ended on an accepted mask
        if not masks or feedback.logits is None:
            return
        group = feedback.logits[start + 1 : start + 1 + masks]  # fed row = node + 1
        ids = feedback.input_ids
        scores = torch.cat([processed_scores(self.logits_processor, ids, g) for g in group])
        if self.do_sample:
            probs = torch.softmax(scores, dim=-1)
            drawn = torch.multinomial(probs, 1)[:, 0]
            # confidences by the distributions only: a candidate kept or dropped by the value drawn would bias sampling
            read = torch.stack([drawn.to(probs.dtype), probs.max(-1).values]).tolist()  # one host read
            self.probs = probs
        else:
            best = scores.log_softmax(-1).max(-1)
            read = torch.stack(
                [best.indices.to(best.values.dtype), best.values.exp()]
            ).tolist()  # one host read
        self.candidates, confidence = [int(t) for t in read[0]], read[1]
        if self.gate is not None:
            self.first = (self.candidates[0], confidence[0], self.gate.probing)
        if self.budget is not None:  # a prefix: the chain's estimates only fall
            scale = self.gate.estimate_scale if self.gate is not None else 1.0
            estimates = [min(e * scale, 1.0) for e in itertools.accumulate(confidence, operator.mul)]
            kept = len(self.budget.keep(estimates, list(range(len(estimates)))))
            self.candidates = self.candidates[:kept]
            self.probs = None if self.probs is None else self.probs[:kept]


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
    specdec_streamer=None,
    space_cost: bool | CostCurve = True,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """``custom_generate`` of SPACE auto-correct decoding (Alg. 1): :class:`SpaceProposer` in the tree core's loop,
    at any batch size (a left-padded batch with its ``attention_mask``).

    ``num_masks`` (default ``config.space_num_masks``, else ``config.space_k``) masks per group; ``mask_token_id``
    defaults to ``config.space_mask_token_id``. ``stats`` (a ``DecodeStats``) is filled as by ``tree_generate``
    (a step's nodes count its masks). Greedy or sampling follows ``generation_config.do_sample``; processors
    (temperature, top-k/p, penalties) apply to every distribution with the exact prefix a plain loop would have.
    ``specdec_streamer``: a streamer fed the prompt, then every emitted token (``core/generate_io.py``).
    ``space_cost`` (default True): verify only the candidates that pay for the width they add on this machine's
    learnt cost curve, and feed the masks only while drafting has been paying; False: every mask and candidate,
    every step (the paper); a ``CostCurve``: that curve.
    """
    cfg = generation_config or model.generation_config
    check_generation_mode(cfg, "SPACE decoding")
    check_prompt(input_ids, "SPACE decoding", batch=True)
    k, mask_id = _space_config(model, num_masks, mask_token_id)
    rows = input_ids.shape[0]  # a batch's rows share each verification forward (DraftBudget)
    budget = candidate_budget(model, first_row(input_ids, model_kwargs), k, space_cost, rows)
    # with the measured costs the gate is kept on the model across generations; a batch's rows pool their outcomes
    gate = None if budget is None else shared_gate(model, model) if space_cost is True else DraftGate()
    proposer = SpaceProposer(k, mask_id, logits_processor, bool(cfg.do_sample), budget, gate)
    return tree_generate(
        model,
        input_ids,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus,
        streamer,
        proposer=proposer,
        stats=stats,
        specdec_streamer=specdec_streamer,
        **model_kwargs,
    )
