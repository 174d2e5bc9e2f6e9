"""CAPE's expansion sets and their tree (GLIDE, arXiv:2402.02082, §4.2), apart from the drafter that proposes them.

- **S(p)**: the size ``K`` of the expansion set of a proposal token of confidence ``p`` (:data:`DEFAULT_EXPANSION`).
- **expansion set** ``X_i``: the ``S(p_i)`` next-best tokens of the draft distribution that gave the proposal token
  ``x_{t+i}`` (its argmax) and its confidence ``p_i`` (its probability).
- **tree**: the proposal chain, each expansion token a leaf sibling of the proposal token of its position; its
  ancestor mask is the paper's ``mask_CAPE``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.tree import ROOT, TokenTree
from ..errors import SpecDecError

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


def ranked_width(expansion: Sequence[tuple[float, int]]) -> int:
    """How many top tokens of a draft distribution one position needs: the proposal and the largest set."""
    return 1 + max(k for _, k in expansion)


def expansion_from(
    values: Sequence[float],
    tokens: Sequence[float],
    expansion: Sequence[tuple[float, int]] = DEFAULT_EXPANSION,
) -> tuple[int, float, list[int], list[float]]:
    """One draft position from its top tokens on the host (``values`` decreasing, ``tokens`` their ids): the
    proposal token, its confidence ``p``, the expansion set (the ``S(p)`` next-best tokens; tokens of probability 0
    are left out) and the set's probabilities."""
    p = values[0]
    kept = [j for j in range(1, min(1 + expansion_size(p, expansion), len(values))) if values[j] > 0]
    return int(tokens[0]), p, [int(tokens[j]) for j in kept], [values[j] for j in kept]


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
