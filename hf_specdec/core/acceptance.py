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
probability ``r(x_i)``, else zero ``r(x_i)`` and renormalize — SpecInfer's rule for deterministic trees
(SpecInfer, arXiv:2305.09781 §4.2; Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", arXiv:2211.17192, Algorithm 1).

**Levels in tensors.** :func:`accept_tree` decides one tree level per iteration: the processors run once, on the
current node's path ids (its children share them), and the greedy match or the sibling loop above (a short
loop of tensor operations over the ``m`` children, their ``m`` uniforms drawn at once, the first accepted child
found by a masked minimum, the fallback token drawn by an exponential race) produces the level's
``(child, token)`` on the device. It is read back once per level, or, when no processor keeps state, once per
step after running every level of the tree (see :func:`accept_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process

from .tree import ROOT, TokenTree, host_to_device

_EPS = 1e-12

#: Processors whose scores for a row depend only on that row's ids and scores and that keep no state between calls
#: (lazily built constants aside): calling them on ids a plain loop never has changes nothing it later computes.
_STATELESS: frozenset[type] = frozenset(
    cls
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "TopHLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "ForcedBOSTokenLogitsProcessor",
        "ForcedEOSTokenLogitsProcessor",
        "InfNanRemoveLogitsProcessor",
        "ExponentialDecayLengthPenalty",
        "LogitNormalization",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
    )
    if (cls := getattr(logits_process, name, None)) is not None
)


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
    return torch.where(total > _EPS, res / total.clamp_min(_EPS), r)


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
    depth = tree.fed_depths()[1:].to(pred.device)  # counted on the device: no host list copied
    order = torch.arange(n, 0, -1, device=pred.device)  # earlier nodes win ties
    best = torch.where(on_path, depth * (n + 1) + order, torch.zeros_like(depth)).argmax()
    row = torch.where(on_path[best], ancestry[best], torch.zeros_like(on_path))
    packed = torch.cat([row.long(), pred]).tolist()  # the step's one host read: the path and the argmaxes
    nodes = [j for j in range(n) if packed[j]]
    fed = [0, *(j + 1 for j in nodes)]
    tokens = [packed[n + f] for f in fed]
    return TreeAcceptance(nodes, tokens, [logits[f : f + 1].float() for f in fed])


def _stateless(logits_processor: LogitsProcessorList) -> bool:
    """Whether every processor is one of :data:`_STATELESS` (exactly that class: a subclass may keep state)."""
    return all(type(p) in _STATELESS for p in logits_processor)


def _first(accepted: torch.Tensor) -> torch.Tensor:
    """Index of the first True of ``accepted`` (``(m,)``), ``m`` when there is none; a 0-dim device tensor."""
    m = accepted.shape[0]
    slots = torch.arange(m, device=accepted.device)
    return torch.where(accepted, slots, torch.full_like(slots, m)).min()


def _sample(r: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token from the distribution ``r`` without a host read: ``argmax r / E`` with ``E_v ~ Exp(1)`` i.i.d.
    (the exponential race, equivalent to the Gumbel-max trick; tokens with ``r = 0`` are never drawn)."""
    device = generator.device if generator is not None else r.device
    race = torch.empty(r.shape, device=device).exponential_(generator=generator).to(r.device)
    return (r / race).argmax()


def _level_greedy(scores: torch.Tensor, kid_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One greedy level: ``(slot, token)``, the first child slot carrying ``argmax scores`` (``m`` = none) and that
    argmax. Padded slots carry the token ``-1``, which never matches."""
    target = scores[0].argmax()
    if kid_tokens.shape[0] == 0:
        return target.new_zeros(()), target
    return _first(kid_tokens == target), target


def _level_sample(
    scores: torch.Tensor,
    kid_tokens: torch.Tensor,
    q: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampling level (module docstring; SpecInfer arXiv:2305.09781 §4.2): the children's tokens ``x_i``
    (``kid_tokens``, ``(m,)``, ``-1`` = a padded slot, which is never accepted and leaves ``r`` alone) and their
    draft rows ``q_i`` (``(m, vocab)``) against ``r = softmax(scores)``. Child ``i`` is accepted when
    ``u_i q_i(x_i) < r_i(x_i)`` (``u_i`` uniform on [0, 1), i.e. with probability ``min(1, r_i(x_i) / q_i(x_i))``),
    where ``r_i`` is the residual once ``c_1..c_{i-1}`` were rejected; the first accepted child is taken, else a
    token is drawn from the last residual. Returns ``(slot, token)`` as 0-dim device tensors, ``slot = m`` when no
    child was accepted. The residuals are a loop of tensor operations over the ``m`` siblings, nothing is read."""
    r = torch.softmax(scores[0], dim=-1)
    m = kid_tokens.shape[0]
    if m == 0:
        return kid_tokens.new_zeros(()), _sample(r, generator)
    device = generator.device if generator is not None else r.device
    u = torch.rand(m, generator=generator, device=device).to(r.device)
    valid = kid_tokens >= 0
    x = kid_tokens.clamp_min(0)
    qx = q.gather(1, x[:, None])[:, 0]
    accepted = []
    for i in range(m):
        accepted.append(u[i] * qx[i] < r[x[i : i + 1]][0])
        r = torch.where(valid[i], _residual(r, q[i]), r)
    slot = _first(torch.stack(accepted) & valid)
    token = torch.where(slot < m, x.gather(0, slot.clamp_max(m - 1)[None])[0], _sample(r, generator))
    return slot, token


def accept_tree(
    tree: TokenTree,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList | None = None,
    do_sample: bool = False,
    generator: torch.Generator | None = None,
    *,
    one_read: bool | None = None,
) -> TreeAcceptance:
    """Walk ``tree`` with the target's ``logits`` (``(1 + n, vocab)``, row 0 = root) after the committed
    ``input_ids`` (``(1, L)``, last token = root). Greedy when ``do_sample`` is False, else lossless tree
    speculative sampling (see the module docstring).

    The walk goes one tree level at a time: at the current node the processors run once on its path ids (the ids a
    plain loop would have there), and all its children are decided by tensor operations (:func:`_level_greedy`,
    :func:`_level_sample`). Which node is current stays on the device, so the walk needs no host read until the
    end when it may run every level down to the tree's depth, the levels past the stop being discarded
    (``one_read``: one host read per step). That calls the processors with ids a plain loop would not have, so it
    is done only when no processor keeps state between calls (:data:`_STATELESS`). Otherwise the walk reads
    ``(child, token)`` back once per level and stops where the path ends (at most ``depth + 1`` reads). By default
    (``one_read=None``) it reads once per step without processors or for greedy decoding with stateless ones, and
    once per level when sampling on a CPU, where a read costs nothing and a processor call for a level past the
    stop (a top-p sort over the vocabulary) would be wasted.
    """
    if not do_sample and not logits_processor:
        return accept_greedy(tree, logits)
    stateless = not logits_processor or _stateless(logits_processor)
    if one_read is None:
        one_read = not logits_processor or (stateless and (not do_sample or logits.device.type != "cpu"))
    elif one_read and not stateless:
        raise ValueError("one_read needs logits processors without state (acceptance._STATELESS)")
    device, n = logits.device, len(tree)
    # fed row (0 = root, node k = k + 1) -> its children, in node order
    kids_of: list[list[int]] = [[] for _ in range(n + 1)]
    for i, p in enumerate(tree.parent_list):
        kids_of[p + 1].append(i)
    # node tokens with a -1 sentinel at the end: index -1 (a padded slot) reads token -1
    tokens = torch.cat([tree.tokens.to(device), torch.full((1,), -1, dtype=torch.long, device=device)])
    probs = tree.draft_probs

    def level(scores: torch.Tensor, kids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kid_tokens = tokens[kids]
        if not do_sample:
            return _level_greedy(scores, kid_tokens)
        if probs is None:  # deterministic drafts: q_i = one_hot(x_i)
            q = torch.zeros(kids.shape[0], logits.shape[-1], device=device)
            q.scatter_(1, kid_tokens.clamp_min(0)[:, None], 1.0)
        else:
            q = probs.index_select(0, kids.clamp_min(0).to(probs.device)).to(device, torch.float32)
        return _level_sample(scores, kid_tokens, q, generator)

    out = TreeAcceptance()
    ids = input_ids
    if not one_read:  # one read per level; the current node is known on the host
        node = ROOT
        while True:
            scores = processed_scores(logits_processor, ids, logits[node + 1])
            out.scores.append(scores)
            kids = kids_of[node + 1]
            slot, token = level(scores, host_to_device(kids, device))
            slot, token = torch.stack([slot, token]).tolist()  # the level's one host read
            out.tokens.append(token)
            if slot == len(kids):
                return out
            node = kids[slot]
            out.nodes.append(node)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=-1)

    width = max(map(len, kids_of))
    # (1 + n, width): each fed row's children, padded with -1
    table = host_to_device([k + [-1] * (width - len(k)) for k in kids_of], device)
    depths = [0, *tree.depths]
    widths = [0] * (tree.max_depth + 1)  # most children of a node at each depth
    for row, kids in enumerate(kids_of):
        widths[depths[row]] = max(widths[depths[row]], len(kids))
    row = torch.zeros(1, dtype=torch.long, device=device)  # fed row of the current node
    picked, emitted, all_scores = [], [], []
    for m in widths:
        scores = processed_scores(logits_processor, ids, logits.index_select(0, row)[0])
        kids = table.index_select(0, row)[0, :m]
        slot, token = level(scores, kids)
        if m:
            node = torch.where(slot < m, kids.gather(0, slot.clamp_max(m - 1)[None])[0], -1)
        else:  # a level of leaves: the walk stops here
            node = torch.full_like(slot, -1)
        picked.append(node)
        emitted.append(token)
        all_scores.append(scores)
        row = (node + 1)[None]  # past the stop: the root again, whose levels are discarded
        if logits_processor:
            ids = torch.cat([ids, token.view(1, 1).to(ids)], dim=-1)
    packed = torch.stack(picked + emitted).tolist()  # the step's one host read
    levels = len(widths)
    for d in range(levels):
        out.tokens.append(packed[levels + d])
        out.scores.append(all_scores[d])
        if packed[d] < 0:
            break
        out.nodes.append(packed[d])
    return out


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
