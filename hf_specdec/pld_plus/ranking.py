"""Ranking the occurrences of the last token (PLD+, arXiv:2412.01447, §4.1-4.2, eq. 1-3)."""

from __future__ import annotations

import torch


def occurrences(ids: torch.Tensor) -> torch.Tensor:
    """Eq. 1: positions ``j < t`` of the 1-D ``ids`` whose token equals the last one, ``x_t = ids[-1]``."""
    return (ids[:-1] == ids[-1]).nonzero().squeeze(1)


def rank_by_hidden(unit_states: torch.Tensor, occ: torch.Tensor) -> tuple[int | None, float]:
    """Eq. 3: the occurrence ``j`` maximising ``cos(H_{j-1}, H_{t-1})``.

    ``unit_states`` holds the L2-normalised layer-``l`` hidden states of positions ``0 .. t-1`` (one row each), so the
    cosine is a dot product; ``occ`` are the occurrences of ``x_t`` (``j = 0`` has no ``H_{j-1}`` and is skipped).
    Returns ``(j, similarity)`` or ``(None, -inf)``.
    """
    if occ.numel() == 0:
        return None, float("-inf")
    # j = 0 masked out rather than dropped (no shape that depends on the data: no device sync on a GPU)
    sims = (unit_states[(occ - 1).clamp(min=0)].float() @ unit_states[-1].float()).masked_fill(
        occ < 1, -torch.inf
    )
    return _best(occ, sims)


def rank_by_attention(rows: torch.Tensor, occ: torch.Tensor) -> tuple[int | None, float]:
    """Eq. 2: the occurrence ``j`` with the largest attention from ``x_{t-1}``, maxed over the selected heads.

    ``rows`` is ``(num_selected_heads, t)``: each selected head's attention row of query ``x_{t-1}`` over keys
    ``0 .. t-1``. Returns ``(j, attention)`` or ``(None, -inf)``.
    """
    if occ.numel() == 0:
        return None, float("-inf")
    return _best(occ, rows[:, occ].amax(dim=0))


def _best(occ: torch.Tensor, scores: torch.Tensor) -> tuple[int | None, float]:
    """The occurrence with the best score and the score, in one host read."""
    best = scores.max(0)
    j, score = torch.stack([occ[best.indices].double(), best.values.double()]).tolist()
    return (None, score) if score == float("-inf") else (int(j), score)
