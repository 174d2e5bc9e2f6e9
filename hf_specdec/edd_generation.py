"""Decoding with an EDD drafter (edd-pct.txt §3.1-3.2): chains in transformers' assisted loop, trees (PCT,
VCT, EAGLE-2) in the tree core's ``tree_generate`` loop.

EDD needs the target's hidden states (layer ``EddConfig.encoder_layer``) of every *verified* token:

- **Chain** (``target.generate(**inputs, assistant_model=edd)``): ``hf_specdec.assisted`` routes the assistant to
  :class:`EddCandidateGenerator`, which sets ``requires_model_outputs`` and ``model_kwargs_overrides =
  {"output_hidden_states": True}``: transformers' ``_assisted_decoding`` then runs every verification forward with
  hidden states and hands that forward's outputs (``model_outputs``) to the next ``get_candidates`` call. The
  verified positions of that forward are the ones left in the (cropped) target cache, so the generator takes the
  states of positions ``[soft-prompt length, len(input_ids) - 1)`` from it. No other patch of transformers.
- **Tree**: :class:`EddTreeProposer` (a ``tree_decoding.TreeProposer`` with ``needs_hidden_states``) gets the
  hidden states of the prompt / the root and accepted nodes in ``StepFeedback.hidden_states`` after every forward.

Either way verification and acceptance are the target's (greedy match, or lossless speculative sampling), so the
output is the target's. :class:`EddDraftState` keeps EDD's own KV cache as ``[soft prompt ; this round]``: the
soft-prompt part grows only with verified tokens, the round part is dropped after each verification (Fig. 3a).
The first round has no soft prompt yet (the target has not run), so the chain drafts nothing there: that forward
is the target's prefill. The ``soft_prompt=False`` ablation keeps the committed tokens instead and drafts at once.
"""

from __future__ import annotations

import time

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .chain_drafting import draft_token, init_chain_drafting
from .errors import SpecDecError
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
from .tree import ROOT, TokenTree, additive_mask
from .tree_decoding import StepFeedback, TreeProposer


class EddDraftState:
    """EDD's KV cache for one generation: ``prefix`` positions (soft prompt, or committed tokens for the
    ablation) followed by the current round (root + drafts)."""

    def __init__(self, edd):
        self.edd = edd
        self.cache = edd.new_cache()
        self.n_prefix = 0  # positions [0, n_prefix) of the cache are verified prefix
        self.pending: list[
            torch.Tensor
        ] = []  # soft-prompt vectors (1, m, D) for the positions after n_prefix
        self.forwards = 0
        self.fed_nodes: list[
            int
        ] = []  # tree nodes in the round part of the cache, in cache order (after the root)

    @property
    def soft_prompt(self) -> bool:
        return bool(self.edd.config.soft_prompt)

    def push_hidden(self, hidden: torch.Tensor) -> None:
        """Soft-prompt vectors (1, m, D) of the next m verified positions."""
        if hidden.shape[1]:
            self.pending.append(hidden)

    def known(self) -> int:
        return self.n_prefix + sum(h.shape[1] for h in self.pending)

    def root_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Start a round at the root ``input_ids[0, -1]``: drop the last round, append the new verified prefix,
        feed the root. Returns EDD's final hidden state at the root, (1, D)."""
        length = input_ids.shape[1]
        extra = self.cache.get_seq_length() - self.n_prefix
        if extra > 0:
            self.cache.crop(-extra)
        if not self.soft_prompt:  # ablation: the prefix is the committed tokens themselves
            self.pending = [self.edd.embed(input_ids[:, self.n_prefix : length - 1])]
        if self.known() != length - 1:
            raise SpecDecError(
                f"EDD soft prompt covers {self.known()} positions but {length - 1} tokens are verified; the target's "
                "hidden states of some verified tokens were not passed to the drafter"
            )
        device = self.edd.decoder.norm.weight.device
        vecs = torch.cat(
            [*(h.to(device) for h in self.pending), self.edd.embed(input_ids[:, -1:].to(device))], dim=1
        )
        positions = torch.arange(self.n_prefix, length, device=device)[None]
        hidden = self.edd.decode(vecs, positions, self.cache)
        self.n_prefix, self.pending, self.fed_nodes = length - 1, [], []
        self.forwards += 1
        return hidden[:, -1]

    def chain_step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Feed one draft token (causal after the cache); returns the hidden state (1, D)."""
        device = self.edd.decoder.norm.weight.device
        pos = torch.tensor([[position]], device=device)
        hidden = self.edd.decode(self.edd.embed(token.reshape(1, 1).to(device)), pos, self.cache)
        self.forwards += 1
        return hidden[:, -1]

    def tree_step(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        """Feed the tokens of tree ``nodes`` (all children of already-fed nodes or of the root) in one forward,
        each seeing the prefix, the root, its fed ancestors and itself; returns their hidden states (m, D)."""
        device = self.edd.decoder.norm.weight.device
        base = self.n_prefix + 1  # prefix + root
        slot = {node: base + i for i, node in enumerate(self.fed_nodes)}
        cache_len = base + len(self.fed_nodes)
        m = len(nodes)
        mask = torch.zeros(m, cache_len + m, dtype=torch.bool)
        mask[:, :base] = True
        for row, node in enumerate(nodes):
            mask[row, cache_len + row] = True
            parent = tree.parents[node]
            while parent != ROOT:
                mask[row, slot[parent]] = True
                parent = tree.parents[parent]
        tokens = torch.tensor([[tree.tokens[n] for n in nodes]], device=device)
        positions = torch.tensor([[self.n_prefix + tree.depth[n] for n in nodes]], device=device)
        attn = additive_mask(mask.to(device), self.edd.dtype)[None, None]
        hidden = self.edd.decode(self.edd.embed(tokens), positions, self.cache, attention_mask=attn)
        self.fed_nodes += nodes
        self.forwards += 1
        return hidden[0]


class EddCandidateGenerator(CandidateGenerator):
    """Chain drafts of gamma tokens (``num_assistant_tokens``, default 5) for transformers' assisted loop."""

    requires_model_outputs = True
    model_kwargs_overrides = {"output_hidden_states": True}

    def __init__(self, edd, target, generation_config, logits_processor=None):
        self.edd = edd
        self.target = target
        self.state = EddDraftState(edd)
        init_chain_drafting(self, edd, generation_config, logits_processor)  # gamma, eos, ...
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
        t0 = time.perf_counter()
        self._take_hidden(input_ids, model_outputs)
        cur_len = input_ids.shape[1]
        budget = min(self.num_draft_tokens, self.max_length - cur_len - 1)
        if budget <= 0 or (self.state.soft_prompt and self.state.known() == 0):
            self.prev_total = cur_len
            return input_ids, None
        device = self.edd.decoder.norm.weight.device
        sequence = input_ids.to(device)
        hidden = self.state.root_step(sequence)
        scores = []
        for i in range(budget):
            token, processed = draft_token(self, self.edd, sequence, self.edd.draft_logits(hidden))
            scores.append(processed)
            sequence = torch.cat([sequence, token], dim=1)
            if (self.eos is not None and int(token) in self.eos) or i == budget - 1:
                break
            hidden = self.state.chain_step(token, sequence.shape[1] - 1)
        self.prev_total = sequence.shape[1]
        self.draft_time += time.perf_counter() - t0
        return sequence, (torch.stack(scores, dim=1) if self.do_sample else None)

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        pass  # gamma is constant


class EddTreeExpander:
    """``pct.Expander`` on an EDD drafter: one EDD forward per call, probabilities over the drafter's vocabulary
    (its reduced draft vocabulary if it has one: ``token_ids`` maps columns to token ids), at the confidence
    temperature ``temperature`` (default: the drafter's calibrated ``config.confidence_temperature``)."""

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
        t0 = time.perf_counter()
        if nodes == [ROOT]:
            hidden = self.state.root_step(self.input_ids)
        else:
            hidden = self.state.tree_step(nodes, tree)
        edd = self.state.edd
        probs = (edd.draft_logits(hidden).float() / self.temperature).softmax(-1)
        if self.timer is not None:
            self.timer.draft(time.perf_counter() - t0)
        return probs


TREE_BUILDERS = ("pct", "vct", "eagle2", "chain")


class EddTreeProposer(TreeProposer):
    """Drafts a tree with EDD each step; ``builder`` is ``"pct"`` (default), ``"vct"``, ``"eagle2"`` or
    ``"chain"`` (top-1 chain of ``depth`` tokens, for checks). Deterministic drafts (``draft_probs=None``), which
    the tree core verifies losslessly both greedily and with sampling.

    s_d/s_t for PCT: running means of the measured EDD forward time and of the measured verification time
    (from the end of ``propose`` to ``observe``) of this generation loop, seeded by a calibration run in the first
    ``start`` (a target forward and an EDD forward over a few tokens). ``ratio=`` pins it.

    Confidences are ``softmax(logits / T)`` with the drafter's calibrated ``config.confidence_temperature``
    (``trainers/calibration.py``); ``confidence_temperature=`` overrides it (1.0: the raw softmax)."""

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
        self.calibrated = False
        self.last_tree: GrownTree | None = None
        self._t_proposed: float | None = None
        self.state: EddDraftState | None = None

    @torch.no_grad()
    def calibrate(self, model, input_ids: torch.Tensor) -> None:
        """First estimates of s_d and s_t on this machine: timed forwards over a short slice of the prompt."""
        ids = input_ids[:, -8:]
        model(input_ids=ids)  # warm-up
        t0 = time.perf_counter()
        model(input_ids=ids)
        s_t = time.perf_counter() - t0
        state = EddDraftState(self.edd)
        state.push_hidden(self.edd.embed(ids[:, :-1]))
        state.root_step(ids)  # warm-up
        t0 = time.perf_counter()
        self.edd.draft_logits(state.chain_step(ids[:, -1:], ids.shape[1])).softmax(-1)
        s_d = time.perf_counter() - t0
        self.timer.calibrate(s_d, s_t)
        self.calibrated = True

    def start(self, model, input_ids, generation_config) -> None:
        if self.edd.target is not model:
            self.edd.attach_target(model)
        if not self.calibrated and self.timer.fixed_ratio is None and self.builder == "pct":
            self.calibrate(model, input_ids)
        self.state = EddDraftState(self.edd)
        self._t_proposed = None

    def observe(self, feedback: StepFeedback) -> None:
        if self._t_proposed is not None:
            self.timer.target(time.perf_counter() - self._t_proposed)
            self._t_proposed = None
        if self.state.soft_prompt:
            self.state.push_hidden(feedback.hidden_states[self.edd.config.encoder_layer])

    @torch.no_grad()
    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        depth = min(self.depth, max_depth)
        if depth <= 0:
            self._t_proposed = time.perf_counter()
            return TokenTree.empty(input_ids.device)
        grown = self.grow(self.expander(self.state, input_ids, self.timer), depth)
        self.last_tree = grown
        self._t_proposed = time.perf_counter()
        return grown.token_tree(input_ids.device)

    def expander(
        self, state: EddDraftState, input_ids: torch.Tensor, timer: StepTimer | None = None
    ) -> EddTreeExpander:
        """The drafter, seen by the tree builders at this proposer's confidence temperature."""
        return EddTreeExpander(state, input_ids, timer, self.confidence_temperature)

    def grow(self, expander, depth: int) -> GrownTree:
        """This proposer's tree (``builder`` and its settings) from ``expander``, at most ``depth`` deep."""
        if self.builder == "pct":
            return grow_pct(expander, self.timer.ratio, self.width, depth, self.removal_threshold)
        if self.builder == "vct":
            return grow_fixed(expander, self.width, depth)
        if self.builder == "eagle2":
            return grow_eagle2(expander, self.width, depth, self.total_tokens)
        return grow_fixed(expander, 1, depth)
