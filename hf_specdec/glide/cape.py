"""CAPE, confidence-aware proposal expansion (glide-cape.txt §4.2), on a GLIDE drafter, verified as a token tree.

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

The drafter keeps its own self-attention cache across steps (``glide.candidate_generator.GlideDraftCache``, shared with the
chain generator): it is cropped to the committed tokens it already holds, so only the tokens after it (the
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
from ..core.tree import ROOT, TokenTree
from ..core.tree_decoding import StepFeedback, TreeProposer, tree_generate
from ..core.verify_cost import CostCurve, measured_cost
from ..errors import SpecDecError
from .candidate_generator import GlideDraftCache

# S(p) of §4.2 as (upper bound of the confidence bin, K): K = 7 for p <= 0.3, 5 for p <= 0.6, 3 for p <= 0.8,
# 1 above. Bins are left-open, right-closed; the last upper bound must be >= 1.
DEFAULT_EXPANSION: tuple[tuple[float, int], ...] = ((0.3, 7), (0.6, 5), (0.8, 3), (1.0, 1))
# No expansion set at any confidence: the proposal chain alone (GLIDE's chain at batch size > 1, modeling/glide.py)
CHAIN: tuple[tuple[float, int], ...] = ((1.0, 0),)


def check_expansion(expansion: Sequence[Sequence[float]]) -> tuple[tuple[float, int], ...]:
    """Validate an S(p) table ``[(upper, K), ...]`` (increasing uppers, last >= 1, K >= 0)."""
    table = tuple((float(u), int(k)) for u, k in expansion)
    uppers = [u for u, _ in table]
    if not table or uppers != sorted(set(uppers)) or uppers[-1] < 1.0 or any(k < 0 for _, k in table):
        raise SpecDecError(
            f"invalid CAPE expansion table {expansion!r}: give [(upper, K), ...] with strictly increasing "
            "confidence upper bounds, the last one >= 1.0, and sizes K >= 0 (default ((0.3, 7), (0.6, 5), "
            "(0.8, 3), (1.0, 1)))"
        )
    return table


def expansion_size(p: float, expansion: Sequence[tuple[float, int]] = DEFAULT_EXPANSION) -> int:
    """K = S(p): the size of the expansion set for a proposal token of confidence ``p``."""
    for upper, k in expansion:
        if p <= upper:
            return k
    return expansion[-1][1]


def expand(
    probs: torch.Tensor, expansion: Sequence[tuple[float, int]] = DEFAULT_EXPANSION
) -> tuple[int, float, list[int], list[float]]:
    """One draft position from one distribution ``probs`` (``(vocab,)``): the proposal token (argmax), its
    confidence ``p = max probs``, the expansion set (the ``S(p)`` next-best tokens in decreasing probability; tokens
    of probability 0 are left out) and the set's probabilities."""
    k_max = max(k for _, k in expansion)
    top = probs.topk(min(k_max + 1, probs.numel()))
    # one host read per draft position (float64 holds every token id exactly)
    packed = torch.cat([top.values.double(), top.indices.double()]).tolist()
    width = top.values.numel()
    values, indices = packed[:width], [int(t) for t in packed[width:]]
    p = values[0]
    k = expansion_size(p, expansion)
    kept = [j for j in range(1, min(1 + k, width)) if values[j] > 0]
    return indices[0], p, [indices[j] for j in kept], [values[j] for j in kept]


def node_estimates(confidences: Sequence[float], sibling_probs: Sequence[Sequence[float]]) -> list[float]:
    """Each node's estimated acceptance probability, in :func:`cape_tree`'s node order: proposal token ``i``
    ``p_1 * ... * p_i``, an expansion token of position ``i`` ``P(reach i) * q`` (``P(reach i) = p_1 * ... *
    p_{i-1}``; ``q`` its draft probability)."""
    reach, chain, leaves = 1.0, [], []
    for p, probs in zip(confidences, sibling_probs):
        leaves += [reach * q for q in probs]
        reach *= p
        chain.append(reach)
    return chain + leaves


def cape_tree(
    proposal: Sequence[int], expansions: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> TokenTree:
    """The expanded proposal as a tree: nodes ``0 .. gamma-1`` are the proposal chain, then the expansion sets in
    position order, each token a leaf child of the proposal token before its position (the root for position 1)."""
    tokens = [int(t) for t in proposal]
    parents = list(range(ROOT, len(tokens) - 1))
    for i, tokens_i in enumerate(expansions):
        tokens += [int(t) for t in tokens_i]
        parents += [i - 1] * len(tokens_i)
    return TokenTree(tokens, parents, device=device)


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
        self.vocab_ids: list[int] | None = None  # the draft vocabulary's token ids, on the host
        self.state: GlideDraftCache | None = None
        self.target_cache = None
        self.eos: set[int] = set()
        self.last_confidences: list[float] = []
        self.last_sizes: list[int] = []
        self.last_chain = 0
        self.shared = gate  # the gate kept across generations (measured costs), else one per generation
        self.gate: DraftGate | None = None
        self._pending: tuple[float, float, int | None] | None = None  # DraftBudget.keep_checked's record

    def start(self, model, input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
        if self.drafter.target is not model:
            self.drafter.attach_target(model)
        self.state = GlideDraftCache(self.drafter)
        self.target_cache = None
        self.eos = set(eos_token_ids(generation_config))
        ids = self.drafter.draft_vocab_ids
        self.vocab_ids = None if ids is None else ids.tolist()  # read once per generation
        self.gate = None if self.budget is None else self.shared or DraftGate()
        self._pending = None

    def observe(self, feedback: StepFeedback) -> None:
        self.target_cache = feedback.past_key_values  # verified prefix: every committed token but the root
        if feedback.tree is not None:  # the chain's nodes (0 .. last_chain - 1) accepted stay in its cache
            self.state.accepted(sum(node < self.last_chain for node in feedback.accepted_nodes))
        if self._pending is not None:
            self.gate.verified(self._pending, feedback.new_tokens, feedback.num_accepted)
            self._pending = None

    def _rank(
        self, sequence: torch.Tensor, logits: torch.Tensor
    ) -> tuple[int, float, list[int], list[float]]:
        """Proposal token, confidence, expansion set (full-vocabulary ids) and the set's draft probabilities,
        from one draft-vocab logits row."""
        if self.logits_processor:
            full = self.drafter.to_full_vocab(logits[None])
            full = self.logits_processor(sequence, full.to(sequence.device))[0]
            return expand(full.softmax(-1), self.expansion)
        token, p, siblings, probs = expand(logits.softmax(-1), self.expansion)
        ids = self.vocab_ids
        if ids is None:
            return token, p, siblings, probs
        return ids[token], p, [ids[s] for s in siblings], probs

    @torch.no_grad()
    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        gamma = min(self.gamma, max_depth)
        self.last_confidences, self.last_sizes, self.last_chain = [], [], 0
        if gamma <= 0 or self.state is None or (self.gate is not None and not self.gate.draft_now()):
            return TokenTree.empty(input_ids.device)  # a skipped step: the drafter catches up on the next one
        # the estimates, corrected by what was accepted
        scale = 1.0 if self.gate is None else self.gate.estimate_scale
        keep = self.state.sync(input_ids)
        step_ids, sequence = input_ids[:, keep:], input_ids
        proposal: list[int] = []
        expansions: list[list[int]] = []
        sibling_probs: list[list[float]] = []
        reach = 1.0  # P(every proposal token so far is accepted), as the drafter estimates it
        for i in range(gamma):
            logits = self.state.step(step_ids, self.target_cache, draft=i > 0)[0]
            token, p, siblings, probs = self._rank(sequence, logits)
            proposal.append(token)
            expansions.append(siblings)
            sibling_probs.append(probs)
            self.last_confidences.append(p)
            reach *= p
            if token in self.eos or i == gamma - 1:
                break
            if self.budget is not None and not self.budget.worth_drafting(
                min(reach * scale, 1.0), len(proposal)
            ):
                break
            step_ids = input_ids.new_tensor([[token]])
            sequence = torch.cat([sequence, step_ids], dim=1)
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


def chain_proposer(drafter, logits_processor: LogitsProcessorList | None = None) -> CapeProposer:
    """GLIDE's (or the vanilla drafter's) chain of gamma tokens (``generation_config.num_assistant_tokens``) as a tree
    proposer: CAPE without expansion sets (:data:`CHAIN`) or cost trimming; what ``target.generate(**batch,
    assistant_model=drafter)`` drafts at batch size > 1 (``core/assisted.py``). Each draft is the argmax of the
    drafter's distribution (after ``logits_processor``): deterministic, so the tree core verifies it losslessly
    greedily and with sampling (one-hot q)."""
    return CapeProposer(
        drafter, chain_length(drafter), expansion=CHAIN, logits_processor=logits_processor, budget=None
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
    """``custom_generate`` for GLIDE + CAPE: ``target.generate(**inputs, custom_generate=hf_specdec.glide_cape,
    drafter=glide)``. A left-padded batch (with ``attention_mask``) drafts and accepts per row (``tree_generate``);
    every ``generate`` argument works as with ``tree_generate`` (pass a streamer as
    ``specdec_streamer=``: transformers 5.23 does not forward ``streamer=`` to a ``custom_generate`` callable;
    ``tree_streamer=`` is its deprecated name).

    Args:
        drafter: a ``GlideForCausalLM`` trained for this target (attached to it here if needed).
        cape_gamma: gamma, proposal length (default: the drafter's ``num_assistant_tokens``, else 5).
        cape_expansion: S(p) as ``[(upper, K), ...]`` (default :data:`DEFAULT_EXPANSION`).
        cape_cost: size the draft by its cost (module docstring, ``core/draft_budget.py``): ``True`` measures the
            verification cost curve and the drafter's cost c on this machine (once, cached on the models), a
            ``CostCurve`` or a ``DraftBudget`` is used as given (a bare curve with a free drafter), ``False`` drafts
            gamma tokens and keeps every token of S(p), as in the paper.
        stats: a ``DecodeStats`` to fill (tau = new tokens per target forward; ``steps[i]["nodes"]``).
    """
    if drafter is None:
        raise SpecDecError(
            "glide_cape needs a GLIDE drafter: target.generate(..., custom_generate=hf_specdec.glide_cape, "
            "drafter=GlideForCausalLM.from_pretrained(path, target=target))"
        )
    check_generation_mode(
        generation_config or model.generation_config, "custom_generate=hf_specdec.glide_cape"
    )
    check_prompt(input_ids, "custom_generate=hf_specdec.glide_cape", batch=True)
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
