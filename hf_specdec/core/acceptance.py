"""Choosing the accepted path of a verified token tree: greedy match and lossless tree speculative sampling.

Both rules walk down from the root. At a fed token ``f`` (the root or an accepted node) the target's
distribution for the next token is ``p = softmax(logits_processor(path_ids, logits[f]))``: the same
processors, temperature, top-k and top-p warpers that ``generate`` built from the ``GenerationConfig``,
applied to the exact ids a plain decoding loop would have at that point (``path_ids`` = committed
sequence + the accepted path so far), so repetition penalties and ``min_length`` behave as in ``_sample``.

**Greedy**: the next token is ``argmax p``; descend into the first child carrying it, else stop and emit it.
Without logits processors ``p`` does not depend on the path, so :func:`accept_greedy` finds the same path with
tensor operations over the whole verified tree (one argmax per fed row, the deepest node whose every ancestor
matched) and reads one small tensor back to the host: the only host read of a greedy step.

**Sampling** (multi-candidate / recursive rejection sampling, SpecInfer §4.2 and EAGLE; the chain case is
Leviathan et al.'s Algorithm 1). The children ``c_1..c_m`` of the current node are tried in node order
against a residual ``r`` that starts as ``p``::

    accept c_i with probability min(1, r(x_i) / q_i(x_i))
    on rejection: r <- normalize(max(r - q_i, 0))
    no child accepted: emit a token sampled from r (and stop)

``q_i`` is the distribution child ``c_i`` was drawn from **given the siblings drawn before it** — a
proposer sampling children i.i.d. from the draft distribution ``q`` stores ``q`` for each of them; one
sampling *without replacement* (EAGLE-2, :func:`sample_children`) stores ``q`` renormalized without the
earlier siblings. With that, each step outputs a token distributed as ``r`` (induction over siblings), so the
emitted sequence is distributed exactly as the target's. **Deterministic drafts** (n-gram lookup, a drafter's
top-k, ``TokenTree.draft_probs is None``) are the degenerate case ``q_i = one_hot(x_i)``: accept with
probability ``r(x_i)``, else zero ``r(x_i)`` and renormalize — SpecInfer's rule for deterministic trees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList

from .tree import ROOT, TokenTree

_EPS = 1e-12


@dataclass
class TreeAcceptance:
    """Outcome of one verification: accepted draft ``nodes`` (path order), the emitted ``tokens``
    (accepted node tokens + one token from the target, ``len(nodes) + 1``) and the processed ``scores``
    (``(1, vocab)`` each) the target had for every emitted token, as ``_sample`` reports them."""

    nodes: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)


def processed_scores(
    logits_processor: LogitsProcessorList | None, ids: torch.Tensor, logits: torch.Tensor
) -> torch.Tensor:
    """The target's scores ``(1, vocab)`` for the token after ``ids``: float32 ``logits`` through the processors
    of the ``generate`` call (the module docstring's ``p`` before the softmax)."""
    scores = logits.to(dtype=torch.float32)[None]
    return logits_processor(ids, scores) if logits_processor else scores


def _residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``normalize(max(r - q, 0))``: what is left of ``r`` once a draft from ``q`` was rejected."""
    res = (r - q).clamp_min_(0.0)
    total = res.sum()
    # total == 0 only if r <= q everywhere, i.e. r == q, in which case the child was accepted surely.
    return res / total if total > _EPS else r


def accept_greedy(tree: TokenTree, logits: torch.Tensor) -> TreeAcceptance:
    """Greedy acceptance without logits processors, in tensors (module docstring): node ``i`` *matches* when its
    token is the target's argmax at its parent; the accepted path ends at the deepest node whose ancestors all
    match (the earliest such node on a tie, like the walk's first matching child), and the emitted tokens are the
    argmaxes along it. ``scores`` holds the emitted tokens' float32 logits rows (what ``_sample`` reports)."""
    pred = logits.argmax(-1)  # (1 + n,): the target's token after each fed row
    n = len(tree)
    if n == 0:
        token = int(pred[0])  # the step's one host read
        return TreeAcceptance([], [token], [logits[0:1].float()])
    matches = tree.tokens.to(pred.device) == pred[tree.parents.to(pred.device) + 1]
    ancestry = tree.ancestor_mask()[1:, 1:].to(pred.device)  # (n, n): node j is node i or an ancestor of it
    on_path = (~ancestry | matches[None, :]).all(1)  # every node from the root down to i matches
    depth = torch.tensor(tree.depths, device=pred.device)
    order = torch.arange(n, 0, -1, device=pred.device)  # earlier nodes win ties
    best = torch.where(on_path, depth * (n + 1) + order, torch.zeros_like(depth)).argmax()
    row = torch.where(on_path[best], ancestry[best], torch.zeros_like(on_path))
    packed = torch.cat([row.long(), pred]).tolist()  # the step's one host read: the path and the argmaxes
    nodes = [j for j in range(n) if packed[j]]
    fed = [0, *(j + 1 for j in nodes)]
    tokens = [packed[n + f] for f in fed]
    return TreeAcceptance(nodes, tokens, [logits[f : f + 1].float() for f in fed])


def accept_tree(
    tree: TokenTree,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None = None,
    do_sample: bool = False,
    generator: torch.Generator | None = None,
) -> TreeAcceptance:
    """Walk ``tree`` with the target's ``logits`` (``(1 + n, vocab)``, row 0 = root) after the committed
    ``input_ids`` (``(1, L)``, last token = root). Greedy when ``do_sample`` is False, else lossless tree
    speculative sampling (see the module docstring)."""
    if not do_sample and not logits_processor:
        return accept_greedy(tree, logits)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parent_list):
        children.setdefault(p, []).append(i)
    tokens = tree.token_list if tree.token_list is not None else tree.tokens.tolist()
    device = logits.device
    out = TreeAcceptance()
    ids, node = input_ids, ROOT
    while True:
        scores = processed_scores(logits_processor, ids, logits[node + 1])
        out.scores.append(scores)
        kids = children.get(node, [])
        if not do_sample:
            target = int(scores[0].argmax())
            nxt = next((c for c in kids if tokens[c] == target), None)
        else:
            r = torch.softmax(scores[0], dim=-1)
            nxt = None
            for c in kids:
                x = tokens[c]
                q = None if tree.draft_probs is None else tree.draft_probs[c].to(device, torch.float32)
                qx = 1.0 if q is None else float(q[x])
                u = float(
                    torch.rand((), generator=generator, device=generator.device if generator else r.device)
                )
                if u < min(1.0, float(r[x]) / qx):
                    nxt = c
                    break
                if q is None:
                    q = torch.zeros_like(r)
                    q[x] = 1.0
                r = _residual(r, q)
            if nxt is None:
                target = int(torch.multinomial(r, 1, generator=generator))
            else:
                target = tokens[nxt]
        out.tokens.append(target)
        if nxt is None:
            return out
        out.nodes.append(nxt)
        ids = torch.cat([ids, ids.new_tensor([[target]])], dim=-1)
        node = nxt


def sample_children(
    probs: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[list[int], torch.Tensor]:
    """Draw ``k`` distinct children from the draft distribution ``probs`` (``(vocab,)``) without replacement.

    Returns the tokens and, per child, the distribution it was drawn from given the earlier ones
    (``probs`` with the earlier children zeroed and renormalized): the ``q`` rows :func:`accept_tree`
    needs (``(k, vocab)``). ``k`` is capped by the support of ``probs``.
    """
    q = probs.to(torch.float32).clone()
    tokens, rows = [], []
    for _ in range(min(k, int((probs > 0).sum()))):
        dist = q / q.sum()
        x = int(torch.multinomial(dist, 1, generator=generator))
        tokens.append(x)
        rows.append(dist)
        q[x] = 0.0
    return tokens, torch.stack(rows) if rows else probs.new_zeros(0, probs.shape[-1])
