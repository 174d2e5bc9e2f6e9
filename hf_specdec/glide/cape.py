"""CAPE, confidence-aware proposal expansion (GLIDE, arXiv:2402.02082, §4.2), on a GLIDE drafter, verified as a token tree.

Usage (one keyword, like the other methods)::

    import hf_specdec
    from hf_specdec.modeling import GlideForCausalLM

    glide = GlideForCausalLM.from_pretrained("runs/glide-smollm2", target=target)
    out = target.generate(**inputs, custom_generate=hf_specdec.glide_cape, drafter=glide, max_new_tokens=128)

Options of :func:`glide_cape`: ``cape_gamma`` (gamma, proposal length; default the drafter's
``generation_config.num_assistant_tokens``, 5 as in the paper), ``cape_expansion`` (the confidence bins of S(p),
see :data:`DEFAULT_EXPANSION`), ``stats`` (a ``DecodeStats``, filled per step, nodes per step in ``stats.steps``)
and ``specdec_streamer``. Greedy or sampling follows ``do_sample`` as in any ``generate`` call.

**Proposal expansion.** Each step the GLIDE drafter runs autoregressively for gamma tokens, cross-attending to the
target's KV cache as verified so far (``StepFeedback.past_key_values`` of the tree core). At draft position
``t + i`` it picks the proposal token ``x_{t+i} = argmax p_D(. | x_{<t+i})``, reads its confidence
``p_i = max p_D``, and takes the expansion set ``X_i``: the ``K_i = S(p_i)`` next-best tokens of the *same*
distribution (no extra drafter forward; expansion tokens are never fed back to the drafter, unlike beam search).
S(p) = 7, 5, 3, 1 for p in (0, 0.3], (0.3, 0.6], (0.6, 0.8], (0.8, 1] (§4.2). When ``generate`` has logits
processors (temperature, top-k/p, penalties) the ranking and the confidence use the processed draft distribution,
the one the target's acceptance will see; without processors, the drafter's own distribution.

**Verification.** The expanded proposal is a token tree: the proposal chain ``x_{t+1} -> ... -> x_{t+gamma}``, and
every token of ``X_i`` is a leaf sibling of ``x_{t+i}`` (child of ``x_{t+i-1}``, or of the root for i = 1). The
tree's nodes are in the paper's linearized order (proposal first, then the expansion sets), and the tree mask
(``tree.py``: prefix, ancestors, itself) is exactly ``mask_CAPE``: token i sees the proposal tokens ``j`` with
``pos(i) > j`` and itself. One target forward verifies it (``tree_decoding.tree_generate``); ``acceptance.py``
keeps the longest accepted path. All drafts are deterministic (``draft_probs=None``, i.e. one-hot q), for which
tree speculative sampling is lossless; greedy is token-identical to plain greedy decoding.

**Drafts sized by their cost (an extension for hardware where verifying and drafting are not free).** S(p) and
gamma size the draft for a GPU, where a forward over 40 tokens costs about what one over 6 costs. On a CPU each
verified node and each drafter forward costs time, so with ``cape_cost`` (on by default: the cost curve ``c(q)`` and
the drafter's cost c measured on this machine) the proposal goes one position deeper only while the tokens so far
are likely enough to pay for that drafter forward, and the tree keeps only the tokens whose estimated acceptance,
``p_1 * ... * p_i`` for a proposal token and ``P(reach i) * p_D(token)`` for an expansion token, pays for their
verification (``core/draft_budget.py`` derives the rule). Where ``c`` is flat and the drafter cheap (a GPU) this
keeps the paper's tree; ``cape_cost=False`` always does.

The drafter keeps its own self-attention cache across steps (``glide.draft_cache.GlideDraftCache``, shared by CAPE's
trees and GLIDE's chain): it is cropped to the committed tokens it already holds, so only the tokens after it (the
accepted expansion token or bonus token, and the root) are fed on the next step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..core.chain_drafting import chain_length
from ..core.draft_budget import DraftBudget, DraftGate, measured_drafter_cost, shared_gate
from ..core.generate_io import check_generation_mode, check_prompt, eos_token_ids, first_row
from ..core.stats import DecodeStats
from ..core.tree import TokenTree
from ..core.tree_decoding import StepFeedback, TreeProposer, tree_generate
from ..core.verify_cost import CostCurve, measured_cost
from ..errors import SpecDecError
from ..shipped import shipped_drafter
from .draft_cache import GlideDraftCache
from .expansion import (
    CHAIN,
    DEFAULT_EXPANSION,
    cape_tree,
    check_expansion,
    expansion_from,
    node_estimates,
    ranked_width,
)


class CapeProposer(TreeProposer):
    """GLIDE + CAPE as a :class:`~hf_specdec.core.tree_decoding.TreeProposer` (see the module docstring).

    ``gamma`` (default: the drafter's ``num_assistant_tokens``, else 5) drafter forwards per step build the chain
    and every expansion set. ``expansion`` is the S(p) table. ``budget``: size the draft by its cost
    (``core/draft_budget.py``: a deeper draft only while it can pay for its drafter forward, then the nodes that pay
    for their verification); ``None`` keeps all of S(p) and gamma, as in the paper.
    ``logits_processor``: the processors of the ``generate`` call (``glide_cape`` passes them), used to rank the draft
    tokens. After each ``propose``, ``last_confidences`` / ``last_sizes`` hold p_i and |X_i| per position, and
    ``last_chain`` the number of proposal tokens verified.
    """

    def __init__(
        self,
        drafter,
        gamma: int | None = None,
        expansion: Sequence[tuple[float, int]] = DEFAULT_EXPANSION,
        logits_processor: LogitsProcessorList | None = None,
        budget: DraftBudget | None = None,
        gate: DraftGate | None = None,
    ):
        if not (hasattr(drafter, "hidden_states") and hasattr(drafter, "draft_logits")):
            raise SpecDecError(
                f"CAPE needs a GLIDE drafter (hf_specdec.modeling.GlideForCausalLM), got {type(drafter).__name__}"
            )
        self.drafter = drafter
        gamma = gamma or chain_length(drafter)
        if int(gamma) < 1:
            raise SpecDecError(f"CAPE gamma (proposal length) must be >= 1, got {gamma}")
        self.gamma = int(gamma)
        self.expansion = check_expansion(expansion)
        self.logits_processor = logits_processor
        self.budget = budget
        self.state: GlideDraftCache | None = None
        self.target_cache = None
        self.eos: set[int] = set()
        self.last_confidences: list[float] = []
        self.last_sizes: list[int] = []
        self.last_chain = 0
        self.shared = gate  # the gate kept across generations (measured costs), else one per generation
        self.gate: DraftGate | None = None
        self._pending: tuple[float, float, int | None] | None = None  # DraftBudget.keep_checked's record
        self.depth = self.gamma

    def start(self, model, input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
        if self.drafter.target is not model:
            self.drafter.attach_target(model)
        self.state = GlideDraftCache(self.drafter)
        self.target_cache = None
        self.eos = set(eos_token_ids(generation_config))
        self.gate = None if self.budget is None else self.shared or DraftGate()
        self._pending = None
        self.depth = self.gamma  # positions the next sized draft runs the drafter for (_draft_sized)

    def observe(self, feedback: StepFeedback) -> None:
        self.target_cache = feedback.past_key_values  # verified prefix: every committed token but the root
        if feedback.tree is not None:  # the chain's nodes (0 .. last_chain - 1) accepted stay in its cache
            self.state.accepted(sum(node < self.last_chain for node in feedback.accepted_nodes))
        if self._pending is not None:
            self.gate.verified(self._pending, feedback.new_tokens, feedback.num_accepted)
            self._pending = None

    def _top(self, sequence: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top :func:`ranked_width` draft probabilities of one draft-vocab logits row, decreasing, and their
        full-vocabulary token ids, on the device."""
        k = ranked_width(self.expansion)
        if self.logits_processor:
            full = self.drafter.to_full_vocab(logits[None])
            probs = self.logits_processor(sequence, full.to(sequence.device))[0].softmax(-1)
            top = probs.topk(min(k, probs.shape[-1]))
            return top.values, top.indices
        top = logits.softmax(-1).topk(min(k, logits.shape[-1]))
        ids = self.drafter.draft_vocab_ids
        return top.values, top.indices if ids is None else ids.to(top.indices.device)[top.indices]

    def _draft_unread(self, step_ids: torch.Tensor, sequence: torch.Tensor, gamma: int) -> list[tuple]:
        """gamma drafter forwards, each proposal token fed back on the device, then one read of every position's
        top tokens (a draft past an end-of-sequence token is drafted and dropped: no read to stop at it)."""
        values, tokens = [], []
        for i in range(gamma):
            v, t = self._top(sequence, self.state.step(step_ids, self.target_cache, draft=i > 0)[0])
            values.append(v)
            tokens.append(t)
            step_ids = t[:1].view(1, 1)
            sequence = torch.cat([sequence, step_ids], dim=1)
        values, tokens = torch.stack([torch.stack(values).double(), torch.stack(tokens).double()]).tolist()
        return [expansion_from(v, t, self.expansion) for v, t in zip(values, tokens)]

    def _draft_sized(
        self, step_ids: torch.Tensor, sequence: torch.Tensor, gamma: int, scale: float
    ) -> list[tuple]:
        """The draft depth the budget asked for at the last step, drafted with one host read after the forwards
        (:meth:`_draft_unread`), cut where the budget stops: a deeper position is drafted only while the proposal so
        far (its estimate corrected by ``scale``) can pay for its drafter forward, and never past end-of-sequence.
        The next step drafts to where this one stopped, one deeper when this one would have gone on."""
        ranked = self._draft_unread(step_ids, sequence, min(self.depth, gamma))
        reach = 1.0  # P(every proposal token so far is accepted), as the drafter estimates it
        for i, (token, p, _, _) in enumerate(ranked):
            reach *= p
            if token in self.eos or not self.budget.worth_drafting(min(reach * scale, 1.0), i + 1):
                self.depth = i + 1
                return ranked[: i + 1]
        self.depth = min(len(ranked) + 1, self.gamma)
        return ranked

    @torch.no_grad()
    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        gamma = min(self.gamma, max_depth)
        self.last_confidences, self.last_sizes, self.last_chain = [], [], 0
        drafting = self.budget is None or self.budget.draft_now(self.gate)
        if gamma <= 0 or self.state is None or not drafting:
            return TokenTree.empty(input_ids.device)  # a skipped step: the drafter catches up on the next one
        # the estimates, corrected by what was accepted
        scale = 1.0 if self.gate is None else self.gate.estimate_scale
        keep = self.state.sync(input_ids)
        step_ids, sequence = input_ids[:, keep:], input_ids
        if self.budget is None:  # nothing to decide between forwards: one host read after them
            ranked = self._draft_unread(step_ids, sequence, gamma)
        else:
            ranked = self._draft_sized(step_ids, sequence, gamma, scale)
        proposal, expansions, sibling_probs = [], [], []
        for token, p, siblings, probs in ranked:
            proposal.append(token)
            expansions.append(siblings)
            sibling_probs.append(probs)
            self.last_confidences.append(p)
            if token in self.eos:
                break
        if self.budget is not None:  # cut on the host lists, then build the one tree that is verified
            depth = [
                *range(1, len(proposal) + 1),
                *(i + 1 for i, siblings in enumerate(expansions) for _ in siblings),
            ]
            estimates = node_estimates(self.last_confidences, sibling_probs)
            kept, self._pending = self.budget.keep_checked(
                self.gate, estimates, depth, len(proposal), proposal[0]
            )
            kept = set(kept)
            # the kept proposal tokens are a prefix of the chain (estimates fall along it); the kept expansion
            # tokens hang below kept proposal tokens only (the kept set is a tree)
            chain = sum(1 for node in kept if node < len(proposal))
            node = iter(range(len(proposal), len(depth)))
            expansions = [[t for t in siblings if next(node) in kept] for siblings in expansions]
            proposal = proposal[:chain]
        self.last_sizes = [len(siblings) for siblings in expansions]  # |X_i| as verified
        self.last_chain = len(proposal)
        return cape_tree(proposal, expansions, input_ids.device)


def chain_proposer(
    drafter,
    target=None,
    logits_processor: LogitsProcessorList | None = None,
    input_ids: torch.Tensor | None = None,
    model_kwargs: dict | None = None,
) -> CapeProposer:
    """GLIDE's (or the vanilla drafter's) chain of up to gamma tokens (``generation_config.num_assistant_tokens``) as a
    tree proposer: CAPE without expansion sets (:data:`CHAIN`); what ``target.generate(**inputs,
    assistant_model=drafter)`` drafts (``core/assisted.py``). With the drafter's ``chain_cost`` on (the default) and
    the call's ``input_ids``, the chain is sized by its cost on this machine and gated by what it yields, as CAPE's
    trees are (``core/draft_budget.py``); else it is always gamma tokens (the papers). Each draft is the argmax of
    the drafter's distribution (after ``logits_processor``): deterministic, so the tree core verifies it losslessly
    greedily and with sampling (one-hot q)."""
    budget, gate = None, None
    if getattr(drafter, "chain_cost", False) and target is not None and input_ids is not None:
        if drafter.target is not target:
            drafter.attach_target(target)
        rows = input_ids.shape[0]
        curve = measured_cost(target, first_row(input_ids, model_kwargs or {}), batch=rows)
        budget = DraftBudget(curve, measured_drafter_cost(drafter, target), rows)
        gate = shared_gate(drafter, target) if rows == 1 else None
    return CapeProposer(
        drafter,
        chain_length(drafter),
        expansion=CHAIN,
        logits_processor=logits_processor,
        budget=budget,
        gate=gate,
    )


def glide_cape(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria=None,
    generation_config: GenerationConfig | None = None,
    synced_gpus: bool = False,
    streamer=None,
    drafter=None,
    cape_gamma: int | None = None,
    cape_expansion: Sequence[tuple[float, int]] | None = None,
    cape_cost: bool | CostCurve = True,
    stats: DecodeStats | None = None,
    specdec_streamer=None,
    tree_streamer=None,
    **model_kwargs,
):
    """``custom_generate`` for GLIDE + CAPE, from "GLIDE with a CAPE: A Low-Hassle Method to Accelerate Speculative
    Decoding" (Du et al., arXiv:2402.02082), §4.1 GLIDE and §4.2 CAPE: ``target.generate(**inputs,
    custom_generate=hf_specdec.glide_cape, drafter=glide)``. A left-padded batch (with ``attention_mask``) drafts and accepts per row (``tree_generate``);
    every ``generate`` argument works as with ``tree_generate`` (pass a streamer as
    ``specdec_streamer=``: transformers 5.23 does not forward ``streamer=`` to a ``custom_generate`` callable;
    ``tree_streamer=`` is its deprecated name).

    Args:
        drafter: a ``GlideForCausalLM`` trained for this target (attached to it here if needed). None: the GLIDE
            drafter shipped for this target (``hf_specdec/shipped.py``, loaded once and kept on the target), else a
            ``SpecDecError`` saying how to train one.
        cape_gamma: gamma, proposal length (default: the drafter's ``num_assistant_tokens``, else 5).
        cape_expansion: S(p) as ``[(upper, K), ...]`` (default :data:`DEFAULT_EXPANSION`).
        cape_cost: size the draft by its cost (module docstring, ``core/draft_budget.py``): ``True`` uses the
            verification cost curve learnt on this machine and the drafter's cost c (kept on the models), a
            ``CostCurve`` or a ``DraftBudget`` is used as given (a bare curve with a free drafter), ``False`` drafts
            gamma tokens and keeps every token of S(p), as in the paper.
        stats: a ``DecodeStats`` to fill (tau = new tokens per target forward; ``steps[i]["nodes"]``).
    """
    check_generation_mode(
        generation_config or model.generation_config, "custom_generate=hf_specdec.glide_cape"
    )
    check_prompt(input_ids, "custom_generate=hf_specdec.glide_cape", batch=True)
    if drafter is None:  # the target's shipped drafter, loaded once; else one error saying how to get one
        drafter = shipped_drafter("glide", model)
    rows = input_ids.shape[0]  # a batch's rows share each verification forward (DraftBudget)
    gate = None
    if cape_cost is True:
        if drafter.target is not model:
            drafter.attach_target(model)
        curve = measured_cost(model, first_row(input_ids, model_kwargs), batch=rows)
        budget = DraftBudget(curve, measured_drafter_cost(drafter, model), rows)
        gate = shared_gate(drafter, model) if rows == 1 else None
    elif isinstance(cape_cost, CostCurve):
        budget = DraftBudget(cape_cost, 0.0, rows)
    else:
        budget = cape_cost or None
    proposer = CapeProposer(
        drafter,
        gamma=cape_gamma,
        expansion=DEFAULT_EXPANSION if cape_expansion is None else cape_expansion,
        logits_processor=logits_processor,
        budget=budget,
        gate=gate,
    )
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
        tree_streamer=tree_streamer,
        **model_kwargs,
    )
