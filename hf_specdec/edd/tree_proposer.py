"""EDD candidate trees (EDD, ACL 2025, §3.2, App. A) as a tree-core :class:`TreeProposer`: PCT, VCT, EAGLE-2, chain."""

from __future__ import annotations

import torch

from ..core.draft_budget import DraftBudget, DraftGate, measured_drafter_cost, shared_gate
from ..core.timing import seconds
from ..core.tree import ROOT, TokenTree
from ..core.tree_decoding import StepFeedback, TreeProposer
from ..core.verify_cost import measured_cost
from ..errors import SpecDecError
from .draft_state import EddDraftState
from .pct import (
    DEFAULT_PCT_MAX_DEPTH,
    DEFAULT_PCT_WIDTH,
    DEFAULT_REMOVAL_THRESHOLD,
    EAGLE2_DEPTH,
    EAGLE2_TOPK,
    EAGLE2_TOTAL,
    VCT_DEPTH,
    VCT_WIDTH,
    GrownTree,
    StepTimer,
    grow_eagle2,
    grow_fixed,
    grow_pct,
)


class EddTreeExpander:
    """``pct.Expander`` on an EDD drafter: one EDD forward per call, probabilities over the drafter's vocabulary
    (its reduced draft vocabulary if it has one: ``token_ids`` maps columns to token ids), at the confidence
    temperature ``temperature`` (default: the drafter's calibrated ``config.confidence_temperature``). With a
    ``timer`` on a sampled step (``StepTimer.timing``) the forward is marked as an s_d sample; nothing else is timed."""

    def __init__(
        self,
        state: EddDraftState,
        input_ids: torch.Tensor,
        timer: StepTimer | None = None,
        temperature: float | None = None,
    ):
        self.state, self.input_ids, self.timer = state, input_ids, timer
        self.token_ids = state.edd.draft_vocab_ids
        self.temperature = temperature or getattr(state.edd.config, "confidence_temperature", 1.0)

    def expand(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        timed = self.timer is not None and self.timer.timing
        start = self.timer.mark() if timed else None
        if nodes == [ROOT]:
            hidden = self.state.root_step(self.input_ids)
        else:
            hidden = self.state.tree_step(nodes, tree)
        edd = self.state.edd
        probs = (edd.draft_logits(hidden).float() / self.temperature).softmax(-1)
        if timed:
            self.timer.draft_span(start, self.timer.mark())
        return probs


TREE_BUILDERS = ("pct", "vct", "eagle2", "chain")


class EddTreeProposer(TreeProposer):
    """Drafts a tree with EDD each step; ``builder`` is ``"pct"`` (default), ``"vct"``, ``"eagle2"`` or
    ``"chain"`` (top-1 chain of ``depth`` tokens, for checks). Deterministic drafts (``draft_probs=None``), which
    the tree core verifies losslessly both greedily and with sampling.

    s_d/s_t for PCT: running means of the measured EDD forward time and of the measured verification time
    (from the end of ``propose`` to ``observe``) of this generation loop, seeded by a calibration run in the first
    ``start`` (a target forward and an EDD forward over a few tokens), then sampled on one step in
    ``pct.TIMED_STEP_EVERY`` with device marks that are read without a sync (``StepTimer``). ``ratio=`` pins it.

    Confidences are ``softmax(logits / T)`` with the drafter's calibrated ``config.confidence_temperature``
    (``trainers/drafters/calibration.py``); ``confidence_temperature=`` overrides it (1.0: the raw softmax).

    ``cost`` (PCT only; default on): size the tree by its cost on this machine (``core/draft_budget.py``): a frontier
    node is expanded when its estimate pays for a drafter forward and its verification (eq. 5's s_d/s_t read as the
    measured costs, ``c_d + max(c(3) - c(2), 0)``, with no timing during decoding), and the grown tree keeps the nodes
    that pay for their verification. ``True`` uses the learnt cost curve and c_d of this machine
    (``core/verify_cost.py``), a ``DraftBudget`` is used as given, ``False`` is the paper's PCT (s_d/s_t timed as it
    decodes, removal threshold). ``ratio=`` pins s_d/s_t and turns the cost rule off."""

    needs_hidden_states = True

    def __init__(
        self,
        edd,
        builder: str = "pct",
        width: int | None = None,
        depth: int | None = None,
        removal_threshold: float = DEFAULT_REMOVAL_THRESHOLD,
        total_tokens: int = EAGLE2_TOTAL,
        ratio: float | None = None,
        confidence_temperature: float | None = None,
        cost: bool | DraftBudget = True,
    ):
        if builder not in TREE_BUILDERS:
            raise SpecDecError(
                f"unknown EDD tree builder {builder!r}; choose from {', '.join(TREE_BUILDERS)}"
            )
        self.edd, self.builder = edd, builder
        defaults = {
            "pct": (DEFAULT_PCT_WIDTH, DEFAULT_PCT_MAX_DEPTH),
            "vct": (VCT_WIDTH, VCT_DEPTH),
            "eagle2": (EAGLE2_TOPK, EAGLE2_DEPTH),
            "chain": (1, 5),
        }[builder]
        self.width = width or defaults[0]
        self.depth = depth or defaults[1]
        self.removal_threshold = removal_threshold
        self.total_tokens = total_tokens
        if confidence_temperature is not None and not confidence_temperature > 0:
            raise SpecDecError(f"confidence_temperature must be > 0, got {confidence_temperature!r}")
        self.confidence_temperature = confidence_temperature
        self.timer = StepTimer(fixed_ratio=ratio)
        self.cost = cost if builder == "pct" and ratio is None else False
        self.budget: DraftBudget | None = cost if isinstance(cost, DraftBudget) else None
        self.calibrated = False
        self.last_tree: GrownTree | None = None
        # a sampled step's mark at the end of propose: where its s_t starts
        self._t_proposed: object | None = None
        self.state: EddDraftState | None = None
        self.gate: DraftGate | None = None
        self._pending: tuple[float, float, int | None] | None = None  # DraftBudget.keep_checked's record

    @torch.no_grad()
    def calibrate(self, model, input_ids: torch.Tensor) -> None:
        """First estimates of s_d and s_t on this machine: timed forwards over a short slice of the prompt."""
        ids = input_ids[:, -8:]
        model(input_ids=ids)  # warm-up
        s_t = seconds(lambda: model(input_ids=ids), ids.device)
        state = EddDraftState(self.edd)
        state.push_hidden(self.edd.embed(ids[:, :-1]))
        state.root_step(ids)  # warm-up
        s_d = seconds(
            lambda: self.edd.draft_logits(state.chain_step(ids[:, -1:], ids.shape[1])).softmax(-1), ids.device
        )
        self.timer.calibrate(s_d, s_t)
        self.calibrated = True

    def start(self, model, input_ids, generation_config) -> None:
        if self.edd.target is not model:
            self.edd.attach_target(model)
        if self.cost is True:  # this call's curve (its context bucket), learnt by this call's forwards
            self.budget = DraftBudget(
                measured_cost(model, input_ids[0]), measured_drafter_cost(self.edd, model)
            )
        if (
            self.budget is None
            and not self.calibrated
            and self.timer.fixed_ratio is None
            and self.builder == "pct"
        ):
            self.calibrate(model, input_ids)
        self.state = EddDraftState(self.edd)
        self._t_proposed = None
        self.timer.begin(input_ids.device)
        self.gate, self._pending = None, None
        if self.builder == "pct" and self.budget is not None:  # measured costs: the gate kept on the drafter
            self.gate = shared_gate(self.edd, model) if self.cost is True else DraftGate()
        self.hidden_layers = (self.edd.config.encoder_layer,)  # the soft prompt's layer: the only one read

    def observe(self, feedback: StepFeedback) -> None:
        if self._t_proposed is not None:
            self.timer.target_span(self._t_proposed, self.timer.mark())
            self._t_proposed = None
        if self.state.soft_prompt:
            self.state.push_hidden(feedback.hidden_states[self.edd.config.encoder_layer])
        if self._pending is not None:
            self.gate.verified(self._pending, feedback.new_tokens, feedback.num_accepted)
            self._pending = None

    @torch.no_grad()
    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        depth = min(self.depth, max_depth)
        timer = self.timer if self.times_steps else None  # s_d / s_t timed only for the paper's PCT
        if timer is not None:
            timer.next_step()
        tree = TokenTree.empty(input_ids.device)
        if depth > 0 and (self.budget is None or self.budget.draft_now(self.gate)):
            self.last_tree = self.grow(self.expander(self.state, input_ids, timer), depth)
            tree = self.last_tree.token_tree(input_ids.device)
        self._t_proposed = timer.mark() if timer is not None and timer.timing else None
        return tree

    @property
    def times_steps(self) -> bool:
        """Whether decoding samples s_d / s_t: the paper's PCT only (no cost rule, no pinned ratio)."""
        return self.builder == "pct" and self.budget is None and self.timer.fixed_ratio is None

    def expander(
        self, state: EddDraftState, input_ids: torch.Tensor, timer: StepTimer | None = None
    ) -> EddTreeExpander:
        """The drafter, seen by the tree builders at this proposer's confidence temperature."""
        return EddTreeExpander(state, input_ids, timer, self.confidence_temperature)

    def grow(self, expander, depth: int) -> GrownTree:
        """This proposer's tree (``builder`` and its settings) from ``expander``, at most ``depth`` deep."""
        if self.builder == "pct" and self.budget is not None:
            # the estimates corrected by what was accepted (core/draft_budget.DraftGate): e * scale >= threshold
            scale = 1.0 if self.gate is None else self.gate.estimate_scale
            # at least the removal threshold: a node below it has no child that is kept (at most 1 / it per depth)
            threshold = max(self.budget.expand_threshold(1) / max(scale, 1e-6), self.removal_threshold)
            grown = grow_pct(expander, threshold, self.width, depth, self.removal_threshold)
            first = grown.tokens[0] if len(grown) else None  # node 0: the top token at the root
            kept, self._pending = self.budget.keep_checked(
                self.gate, grown.estimate, grown.depth, grown.expansions, first
            )
            return grown.subset(kept)
        if self.builder == "pct":
            return grow_pct(expander, self.timer.ratio, self.width, depth, self.removal_threshold)
        if self.builder == "vct":
            return grow_fixed(expander, self.width, depth)
        if self.builder == "eagle2":
            return grow_eagle2(expander, self.width, depth, self.total_tokens)
        return grow_fixed(expander, 1, depth)
