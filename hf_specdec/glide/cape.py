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

**Verification cost (an extension for hardware where verifying more tokens is not free).** S(p) sizes the sets
for a GPU, where a forward over 40 tokens costs about what one over 6 costs. On a CPU each extra node costs time,
so with ``cape_cost`` (on by default: the cost curve ``c(q)`` measured on this machine,
``verify_cost.measured_cost``) an expansion token is kept only if it pays for itself: its expected gain,
``P(reach position i) * p_D(token)`` with ``P(reach i) = p_1 * ... * p_{i-1}`` (the proposal's confidences
before it), must be at least the marginal cost ``c(n + 1) - c(n)`` of one more verified token (in one-token
forwards, as PCT's ``p >= s_d/s_t``). Tokens are taken best gain first. Where ``c`` is flat (a GPU) this keeps
the whole of S(p); ``cape_cost=False`` always does.

The drafter keeps its own self-attention cache across steps (``glide_generation.GlideDraftCache``, shared with the
chain generator): it is cropped to the committed tokens it already holds, so only the tokens after it (the
accepted expansion token or bonus token, and the root) are fed on the next step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..core.chain_drafting import chain_length
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
    p = float(top.values[0])
    k = expansion_size(p, expansion)
    values, indices = top.values[1 : 1 + k], top.indices[1 : 1 + k]
    keep = values > 0
    return int(top.indices[0]), p, indices[keep].tolist(), values[keep].tolist()


def trim_by_cost(
    confidences: Sequence[float], sibling_probs: Sequence[Sequence[float]], cost: CostCurve, rows: int = 1
) -> list[int]:
    """How many tokens of each expansion set to keep: best expected gain ``P(reach i) * q`` first, while it is at
    least the marginal verification cost ``c(n + 1) - c(n)`` (``n`` = tokens verified so far: root + proposal +
    kept expansion tokens). Sets are sorted by probability, so each keeps a prefix. In a batch of ``rows`` rows
    (``cost`` the batch's curve) a wider tree slows every row: the marginal cost counts ``rows`` times."""
    reach, gains = 1.0, []
    for i, (p, probs) in enumerate(zip(confidences, sibling_probs)):
        gains += [(reach * q, i) for q in probs]
        reach *= p
    keep = [0] * len(confidences)
    n = 1 + len(confidences)
    for gain, i in sorted(gains, reverse=True):
        if gain < rows * (cost(n + 1) - cost(n)):
            break
        keep[i] += 1
        n += 1
    return keep


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
    return TokenTree(
        torch.tensor(tokens, dtype=torch.long, device=device),
        torch.tensor(parents, dtype=torch.long, device=device),
    )


class CapeProposer(TreeProposer):
    """GLIDE + CAPE as a :class:`~hf_specdec.core.tree_decoding.TreeProposer` (see the module docstring).

    ``gamma`` (default: the drafter's ``num_assistant_tokens``, else 5) drafter forwards per step build the chain
    and every expansion set. ``expansion`` is the S(p) table. ``rows``: the batch's rows (``trim_by_cost``).
    ``logits_processor``: the processors of the ``generate`` call (``glide_cape`` passes them), used to rank the draft
    tokens. After each ``propose``,
    ``last_confidences`` / ``last_sizes`` hold p_i and |X_i| per position.
    """

    def __init__(
        self,
        drafter,
        gamma: int | None = None,
        expansion: Sequence[tuple[float, int]] = DEFAULT_EXPANSION,
        logits_processor: LogitsProcessorList | None = None,
        cost: CostCurve | None = None,
        rows: int = 1,
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
        self.cost = cost
        self.rows = rows
        self.state: GlideDraftCache | None = None
        self.target_cache = None
        self.eos: set[int] = set()
        self.last_confidences: list[float] = []
        self.last_sizes: list[int] = []

    def start(self, model, input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
        if self.drafter.target is not model:
            self.drafter.attach_target(model)
        self.state = GlideDraftCache(self.drafter)
        self.target_cache = None
        self.eos = set(eos_token_ids(generation_config))

    def observe(self, feedback: StepFeedback) -> None:
        self.target_cache = feedback.past_key_values  # verified prefix: every committed token but the root

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
        ids = self.drafter.draft_vocab_ids
        if ids is None:
            return token, p, siblings, probs
        return int(ids[token]), p, ids[siblings].tolist() if siblings else [], probs

    @torch.no_grad()
    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        gamma = min(self.gamma, max_depth)
        self.last_confidences, self.last_sizes = [], []
        if gamma <= 0 or self.state is None:
            return TokenTree.empty(input_ids.device)
        keep = self.state.sync(input_ids)
        step_ids, sequence = input_ids[:, keep:], input_ids
        proposal: list[int] = []
        expansions: list[list[int]] = []
        sibling_probs: list[list[float]] = []
        for i in range(gamma):
            logits = self.state.step(step_ids, self.target_cache)[0]
            token, p, siblings, probs = self._rank(sequence, logits)
            proposal.append(token)
            expansions.append(siblings)
            sibling_probs.append(probs)
            self.last_confidences.append(p)
            if token in self.eos or i == gamma - 1:
                break
            step_ids = input_ids.new_tensor([[token]])
            sequence = torch.cat([sequence, step_ids], dim=1)
        if self.cost is not None:
            keep = trim_by_cost(self.last_confidences, sibling_probs, self.cost, self.rows)
            expansions = [siblings[:k] for siblings, k in zip(expansions, keep)]
        self.last_sizes = [len(siblings) for siblings in expansions]
        return cape_tree(proposal, expansions, input_ids.device)


def chain_proposer(drafter, logits_processor: LogitsProcessorList | None = None) -> CapeProposer:
    """GLIDE's (or the vanilla drafter's) chain of gamma tokens (``generation_config.num_assistant_tokens``) as a tree
    proposer: CAPE without expansion sets (:data:`CHAIN`) or cost trimming; what ``target.generate(**batch,
    assistant_model=drafter)`` drafts at batch size > 1 (``core/assisted.py``). Each draft is the argmax of the
    drafter's distribution (after ``logits_processor``): deterministic, so the tree core verifies it losslessly
    greedily and with sampling (one-hot q)."""
    return CapeProposer(
        drafter, chain_length(drafter), expansion=CHAIN, logits_processor=logits_processor, cost=None
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
        cape_cost: keep only expansion tokens that pay their verification cost (module docstring): ``True``
            measures the cost curve on this machine (once, cached on the model), a ``CostCurve`` is used as given,
            ``False`` keeps every token of S(p) as in the paper.
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
    rows = input_ids.shape[0]  # a batch's rows share each verification forward (trim_by_cost)
    proposer = CapeProposer(
        drafter,
        gamma=cape_gamma,
        expansion=DEFAULT_EXPANSION if cape_expansion is None else cape_expansion,
        logits_processor=logits_processor,
        cost=(
            measured_cost(model, first_row(input_ids, model_kwargs), batch=rows)
            if cape_cost is True
            else (cape_cost or None)
        ),
        rows=rows,
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
