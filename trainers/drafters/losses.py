"""Drafter training losses (EDD, ACL 2025, §3.1).

- ``kl_loss``: eq. 4, ``D_KL(P_t || P_d) = sum_x P_t(x) log(P_t(x) / P_d(x))`` between the target's next-token
  distribution ``P_t`` (obtained for free while the frozen target encodes the text) and the drafter's ``P_d``,
  averaged over the supervised positions. Soft-label distillation: the drafter is pushed towards the target's
  whole distribution, which is what the acceptance rate depends on.
- ``ce_loss``: cross entropy against the data's next tokens (the "w/o KL divergence" ablation, Table 3).

And the acceptance rate the papers report (GLIDE, arXiv:2402.02082, §5 "Metrics", after Leviathan et al. 2023):

- ``expected_acceptance``: ``beta = sum_x min(P_t(x), P_d(x))``, the probability that speculative sampling accepts
  a token sampled from the drafter; alpha is its mean over positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def kl_loss(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Mean over rows of ``KL(softmax(target/T) || softmax(draft/T))``; both ``(N, V)``. 0 for N == 0."""
    if draft_logits.shape != target_logits.shape:
        raise ValueError(f"logit shapes differ: {tuple(draft_logits.shape)} vs {tuple(target_logits.shape)}")
    if draft_logits.shape[0] == 0:
        return draft_logits.sum() * 0.0
    log_p = (target_logits.float() / temperature).log_softmax(-1)
    log_q = (draft_logits.float() / temperature).log_softmax(-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def ce_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross entropy of ``(N, V)`` logits against ``(N,)`` labels (``-100`` ignored); 0 if nothing is supervised."""
    if labels.numel() == 0 or bool((labels == IGNORE_INDEX).all()):
        return draft_logits.sum() * 0.0
    return F.cross_entropy(draft_logits.float(), labels, ignore_index=IGNORE_INDEX)


def draft_loss(
    kind: str, draft_logits: torch.Tensor, labels: torch.Tensor, target_logits: torch.Tensor | None
):
    """``kind`` = ``"kl"`` (eq. 4, needs ``target_logits``) or ``"ce"``."""
    if kind == "kl":
        if target_logits is None:
            raise ValueError("the KL loss needs the target's logits")
        return kl_loss(draft_logits, target_logits)
    if kind == "ce":
        return ce_loss(draft_logits, labels)
    raise ValueError(f"unknown loss {kind!r}; use 'kl' or 'ce'")


def expected_acceptance(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_vocab_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Per row, ``beta = sum_x min(P_t(x), P_d(x))`` (GLIDE, arXiv:2402.02082, §5: alpha = E[beta]).

    ``target_logits`` is ``(N, V)`` over the target's whole vocabulary; ``draft_logits`` is ``(N, V_d)``, over
    ``draft_vocab_ids`` (a reduced draft vocabulary: the drafter puts no mass elsewhere) or over the same ``V``.
    """
    p = target_logits.float().softmax(-1)
    if draft_vocab_ids is not None:
        p = p[:, draft_vocab_ids]
    if p.shape != draft_logits.shape:
        raise ValueError(f"target / draft shapes differ: {tuple(p.shape)} vs {tuple(draft_logits.shape)}")
    return torch.minimum(p, draft_logits.float().softmax(-1)).sum(-1)


def teacher_top_k(target_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's ``k`` most likely tokens and their log-probabilities under the full softmax: ``(ids, logp)``, both
    ``(..., k)``. What a feature store keeps of the teacher (a full 49k-row distribution per token would not fit)."""
    logp = target_logits.float().log_softmax(-1)
    top = logp.topk(k, dim=-1)
    return top.indices, top.values


def top_k_kl_loss(draft_logits: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``KL(P_k || P_d)`` where ``P_k`` is the target's distribution renormalised over its top-k
    tokens ``ids`` (``(N, k)`` draft-vocabulary columns, -100 for a token the draft vocabulary lacks, which is left
    out) with log-probabilities ``logp``; ``P_d`` is the drafter's softmax over its vocabulary. Eq. 4 of
    EDD (ACL 2025) with the teacher truncated to its top k (the form a feature store can hold)."""
    if draft_logits.shape[0] == 0:
        return draft_logits.sum() * 0.0
    keep = ids >= 0
    log_pk = logp.float().masked_fill(~keep, float("-inf")).log_softmax(-1)
    log_pk = torch.where(
        keep, log_pk, torch.zeros((), device=log_pk.device)
    )  # no NaN where a row keeps nothing
    log_q = draft_logits.float().log_softmax(-1).gather(-1, ids.clamp(min=0))
    terms = torch.where(keep, log_pk.exp() * (log_pk - log_q), torch.zeros((), device=log_q.device))
    return terms.sum(-1).mean()
