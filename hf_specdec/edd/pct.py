"""Candidate-tree construction from a drafter's confidences: PCT and the baselines of EDD (ACL 2025) App. A.

Vocabulary (EDD, ACL 2025, §3.2):

- **confidence** ``c`` of a draft token: the drafter's probability for it (its softmax at that node).
- **acceptance estimate** of a node: ``p_j = prod_{i<=j} c_i`` over the path from the root (§3.2: the
  confidences are well calibrated with the acceptance rate, Fig. 3b, so ``p_j`` estimates the probability that
  the node and all its ancestors are accepted).
- **s_d / s_t**: the time of one drafter forward and one target (verification) forward. Expanding a node whose
  estimate is ``p_j`` gains ``p_j * s_t - s_d`` in expectation (eq. 5), so only nodes with ``p_j >= s_d/s_t`` are
  worth expanding. The ratio is *measured on the running machine* (``StepTimer``), not a constant.

Algorithms (each returns a :class:`GrownTree`, whose ``token_tree()`` is the ``hf_specdec.core.tree.TokenTree``
verified by the tree core):

- :func:`grow_pct` -- **PCT** (§3.2, Fig. 4): every layer, the drafter proposes the top-``width`` children of
  each *expandable* node of the previous layer; a node is expandable iff its estimate is ``>= s_d/s_t``; stop
  when nothing is expandable or at ``max_depth``; finally drop the nodes whose estimate is below the removal
  threshold (App. B: 0.01; Fig. 4 uses 0.05). Width and depth therefore adapt to the drafter's confidence.
- :func:`grow_fixed` -- **VCT** (App. A): every node expanded with ``width`` children down to ``depth``.
- :func:`grow_eagle2` -- **EAGLE-2**-style (App. A; Li et al. 2024a): expand the ``topk`` best nodes (by
  estimate) of each layer with their top-``topk`` children for ``depth`` layers, then re-rank all candidates by
  estimate and keep the best ``total_tokens``.

The drafter side is abstracted as an :class:`Expander`: ``expand(nodes, tree)`` returns the drafter's next-token
distribution at each listed node (``-1`` = the root, the last committed token), one drafter forward per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..core.timing import DeviceTimer
from ..core.tree import ROOT, TokenTree
from ..errors import SpecDecError

DEFAULT_PCT_WIDTH = 5  # App. B: expansion width of each node
DEFAULT_PCT_MAX_DEPTH = 10  # App. B: maximum depth
DEFAULT_REMOVAL_THRESHOLD = 0.01  # App. B: leaves with overall acceptance confidence < 0.01 are removed
VCT_WIDTH, VCT_DEPTH = 3, 5  # App. A: vanilla candidate tree
EAGLE2_TOPK, EAGLE2_DEPTH, EAGLE2_TOTAL = 10, 6, 50  # App. A: EAGLE-2 settings


@dataclass
class GrownTree:
    """Draft nodes in topological (breadth-first) order: ``tokens``, ``parents`` (``-1`` = root), per-node
    ``confidence`` c and acceptance ``estimate`` p (product of confidences on the path), ``depth``; plus the
    number of drafter forwards spent (``expansions``)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    estimate: list[float] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    expansions: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, confidence: float) -> int:
        parent_estimate = 1.0 if parent == ROOT else self.estimate[parent]
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.confidence.append(float(confidence))
        self.estimate.append(parent_estimate * float(confidence))
        self.depth.append(1 if parent == ROOT else self.depth[parent] + 1)
        return len(self.tokens) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def subset(self, keep: list[int]) -> GrownTree:
        """The nodes ``keep`` (must contain every kept node's parent), re-indexed in their original order."""
        keep = sorted(keep)
        remap = {ROOT: ROOT, **{old: new for new, old in enumerate(keep)}}
        out = GrownTree(expansions=self.expansions)
        for old in keep:
            if self.parents[old] not in remap:
                raise SpecDecError(f"tree subset keeps node {old} but not its parent {self.parents[old]}")
            out.tokens.append(self.tokens[old])
            out.parents.append(remap[self.parents[old]])
            out.confidence.append(self.confidence[old])
            out.estimate.append(self.estimate[old])
            out.depth.append(self.depth[old])
        return out

    def token_tree(self, device: torch.device | str = "cpu") -> TokenTree:
        if not self.tokens:
            return TokenTree.empty(device)
        return TokenTree(self.tokens, self.parents, device=device)


class Expander(Protocol):
    """The drafter seen by the tree builders. ``token_ids``: the token id of each probability column (a drafter
    with a reduced draft vocabulary), or ``None`` when column ``i`` is token ``i``."""

    token_ids: torch.Tensor | None

    def expand(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        """``(len(nodes), vocab)`` next-token probabilities at each of ``nodes`` (``-1`` = the root)."""
        ...


def _top_children(
    probs: torch.Tensor, width: int, token_ids: torch.Tensor | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    k = min(width, probs.shape[-1])
    values, indices = probs.float().topk(k, dim=-1)
    if token_ids is not None:
        indices = token_ids.to(indices.device)[indices]
    # one host read per expansion (float64 holds every token id exactly)
    packed = torch.stack([indices.double(), values.double()]).tolist()
    return [[int(t) for t in row] for row in packed[0]], packed[1]


def grow_pct(
    expander: Expander,
    expand_threshold: float,
    width: int = DEFAULT_PCT_WIDTH,
    max_depth: int = DEFAULT_PCT_MAX_DEPTH,
    removal_threshold: float = DEFAULT_REMOVAL_THRESHOLD,
) -> GrownTree:
    """PCT (§3.2): ``expand_threshold`` is s_d/s_t; see the module docstring."""
    if width < 1 or max_depth < 0:
        raise SpecDecError(f"PCT needs width >= 1 and max_depth >= 0 (got {width}, {max_depth})")
    tree = GrownTree()
    frontier = [ROOT]  # the root is committed: estimate 1, always expandable
    for _ in range(max_depth):
        if not frontier:
            break
        probs = expander.expand(frontier, tree)
        tree.expansions += 1
        tokens, confs = _top_children(probs, width, getattr(expander, "token_ids", None))
        new = [
            tree.add(t, parent, c) for parent, ts, cs in zip(frontier, tokens, confs) for t, c in zip(ts, cs)
        ]
        frontier = [i for i in new if tree.estimate[i] >= expand_threshold]
    # Estimates never grow along a path, so "drop the leaves below the threshold" (repeatedly) is the same as
    # keeping exactly the nodes at or above it; the kept set is closed under taking parents.
    return tree.subset([i for i, p in enumerate(tree.estimate) if p >= removal_threshold])


def grow_fixed(expander: Expander, width: int = VCT_WIDTH, depth: int = VCT_DEPTH) -> GrownTree:
    """VCT (App. A): the full ``width``-ary tree of the drafter's top children, ``depth`` layers deep."""
    tree = GrownTree()
    frontier = [ROOT]
    for _ in range(depth):
        frontier = _expand_layer(expander, tree, frontier, width)
    return tree


def _expand_layer(expander: Expander, tree: GrownTree, frontier: list[int], k: int) -> list[int]:
    """One drafter expansion of ``frontier``: each node gets its ``k`` most confident children; returns them."""
    probs = expander.expand(frontier, tree)
    tree.expansions += 1
    tokens, confs = _top_children(probs, k, getattr(expander, "token_ids", None))
    return [tree.add(t, parent, c) for parent, ts, cs in zip(frontier, tokens, confs) for t, c in zip(ts, cs)]


def grow_eagle2(
    expander: Expander, topk: int = EAGLE2_TOPK, depth: int = EAGLE2_DEPTH, total_tokens: int = EAGLE2_TOTAL
) -> GrownTree:
    """EAGLE-2-style dynamic tree (App. A): expand the ``topk`` best nodes of each layer, re-rank everything."""
    tree = GrownTree()
    frontier = [ROOT]
    for _ in range(depth):
        layer = _expand_layer(expander, tree, frontier, topk)
        frontier = sorted(layer, key=lambda i: -tree.estimate[i])[:topk]
    return rerank(tree, total_tokens)


def rerank(tree: GrownTree, total_tokens: int) -> GrownTree:
    """The ``total_tokens`` nodes with the highest estimates, kept connected: ties go to shallower, earlier nodes,
    and a node whose parent was not kept is skipped (cannot happen unless estimates tie)."""
    order = sorted(range(len(tree)), key=lambda i: (-tree.estimate[i], tree.depth[i], i))
    kept: set[int] = set()
    for i in order:
        if len(kept) >= total_tokens:
            break
        if tree.parents[i] == ROOT or tree.parents[i] in kept:
            kept.add(i)
    return tree.subset(list(kept))


TIMED_STEP_EVERY = 16
"""The paper's PCT times ``s_d`` and ``s_t`` on one decoding step in this many (a *sampled* step; a generation's
first step is one), after the calibration of its first ``start``: the means move slowly, and a timed step costs
device marks and their reading (:class:`~hf_specdec.core.timing.DeviceTimer`), which the other steps skip."""


class StepTimer:
    """Running means of s_d (one drafter forward) and s_t (one target verification forward) on this machine.

    ``ratio`` is s_d/s_t, PCT's expansion threshold (eq. 5). Until both have been observed it uses the
    calibration values given to :meth:`calibrate` (or ``initial_ratio``). ``fixed_ratio`` pins it (ablations).

    While decoding, :meth:`begin` starts a generation on a device and :meth:`next_step` counts its steps; on a
    sampled one (one in ``every``, :data:`TIMED_STEP_EVERY`; ``timing`` is then True) the caller marks its timed
    regions with :meth:`mark` and hands each pair to :meth:`draft_span` / :meth:`target_span`. A pair is read
    lazily, when ``ratio`` is next needed and the device has passed its end (never waiting for it): until then it
    stays pending. :meth:`draft` / :meth:`target` add a time in seconds directly."""

    def __init__(
        self,
        initial_ratio: float = 0.1,
        fixed_ratio: float | None = None,
        momentum: float = 0.9,
        every: int = TIMED_STEP_EVERY,
    ):
        self.initial_ratio = initial_ratio
        self.fixed_ratio = fixed_ratio
        self.momentum = momentum
        self.every = every
        self.s_d: float | None = None
        self.s_t: float | None = None
        self.timing = False  # whether the current step is a sampled (timed) one
        self._clock: DeviceTimer | None = None
        self._step = 0
        self._spans: list[tuple[Callable[[float], None], object, object]] = []  # (update, start, end) unread

    def _update(self, old: float | None, value: float) -> float:
        return value if old is None else self.momentum * old + (1 - self.momentum) * value

    def draft(self, seconds: float) -> None:
        self.s_d = self._update(self.s_d, seconds)

    def target(self, seconds: float) -> None:
        self.s_t = self._update(self.s_t, seconds)

    def calibrate(self, s_d: float, s_t: float) -> None:
        self.s_d, self.s_t = s_d, s_t

    def begin(self, device: torch.device | str) -> None:
        """A generation starts on ``device``: its marks are taken there, its first step is sampled."""
        self.collect()
        self._clock, self._step, self.timing = DeviceTimer(device), 0, False

    def next_step(self) -> bool:
        """Count a decoding step; whether it is sampled (``timing``: one in ``every``, never with ``fixed_ratio``)."""
        self.timing = self._clock is not None and self.fixed_ratio is None and self._step % self.every == 0
        self._step += 1
        return self.timing

    def mark(self) -> object:
        """A point in the device's queued work (:meth:`DeviceTimer.mark`), for a timed region of a sampled step."""
        return self._clock.mark()

    def draft_span(self, start: object, end: object) -> None:
        """A drafter forward ran between marks ``start`` and ``end``: an s_d sample, read lazily."""
        self._spans.append((self.draft, start, end))

    def target_span(self, start: object, end: object) -> None:
        """A verification ran between marks ``start`` and ``end``: an s_t sample, read lazily."""
        self._spans.append((self.target, start, end))

    def collect(self) -> None:
        """Fold the pending samples the device has finished into the means, in order; never waits for it."""
        while self._spans:
            update, start, end = self._spans[0]
            elapsed = self._clock.elapsed(start, end)
            if elapsed is None:  # the device has not got there yet (the later ones neither)
                return
            update(elapsed)
            self._spans.pop(0)

    @property
    def ratio(self) -> float:
        if self.fixed_ratio is not None:
            return self.fixed_ratio
        self.collect()
        if self.s_d is None or not self.s_t:
            return self.initial_ratio
        return self.s_d / self.s_t
