"""Train as you draft: the unrolled multi-step loss of a drafter (EAGLE-3's "training-time test", Li et al. 2025,
arXiv:2503.01840), for EDD and GLIDE alike (``DrafterTrainer(ttt_steps=, ttt_decay=)``, ``--ttt-steps`` /
``--ttt-decay``).

Both drafters are trained teacher-forced: every input token is the data's. At inference they draft in rounds: the
round starts from the last committed token (the target's bonus token) and every later input of the round is the
drafter's own previous draft (greedy: its argmax over the draft vocabulary).
The training masks already cut the sequence into such rounds: EDD's dual-block mask (EDD, ACL 2025, §3.1, Fig. 3a,
eq. 3: a token of block ``j`` sees the soft prompt of blocks ``< j`` and its own block's tokens) and GLIDE's
block-wise cross-attention mask (GLIDE, arXiv:2402.02082, §4.1: a query of block ``j`` sees the target's cache of blocks
``< j``). Position ``i`` of a block of length ``L`` is a round start when ``i % L == 0``; every other position's
input is, at inference, a drafted token (``modeling/masks.drafted_positions``).

The unrolled loss runs the training pass ``K`` times over the same batch (same soft prompt / target cache, same
block length, same teacher):

- step 1 is today's teacher-forced pass and loss, unchanged;
- step ``k > 1`` feeds back step ``k - 1``'s greedy predictions: the input at each drafted position ``i`` becomes
  the argmax step ``k - 1`` predicted at ``i - 1`` (:func:`feed_back`; round starts keep the committed token).
  The loss is the same per-position loss as step 1 (KL to the target, or CE), against the same targets: the
  target's distribution at each position of the data. Where a draft differs from the data, the teacher is still
  the target's distribution after the data (as in EAGLE-3, whose targets stay the data's): the drafter learns to
  continue the text from its own drafts; where its drafts equal the data, the teacher is exactly the target's
  distribution after them.

This is a Jacobi iteration of the rounds: after ``k`` steps the first ``k`` inputs of every round are exactly the
tokens the drafter drafts at inference (greedy), so the step-``k`` loss at a round's ``k``-th draft is the loss
the drafter meets at that depth when it drafts; ``K = L`` steps reproduce greedy drafting of whole rounds. Deeper
positions see a mix of its drafts and earlier guesses. The fed-back tokens are argmaxes, so no gradient runs
through them (EAGLE-3 feeds back hidden states, which carry one; what EDD and GLIDE feed back at inference is a
token): the gradient of step ``k`` reaches the drafter's weights through the step-``k`` pass itself.

The total is ``sum_k w_k L_k / sum_k w_k`` with ``w_k = decay ** (k - 1)`` (:func:`step_weights`; EAGLE-3 weighs
its steps by ``0.8 ** k``). ``K = 1`` is today's loss exactly: the trainer then returns step 1's loss untouched.

Each drafter says which inputs are drafted (``drafter.drafted_positions``) and how it is run with fed-back inputs
(``drafter.unrolled_inputs``): EDD's tokens see only their own block's tokens, so it reruns the pass on the fed-back
ids; GLIDE's self-attention sees every earlier token, which at inference are the *verified* ones, so it runs over
``[data ; fed-back]`` with the mask of ``modeling/masks.dual_block_mask`` (a fed-back query sees the data tokens
before its round and the fed-back tokens of its round), at about twice the cost of a plain pass.

Measured (docs/edd-pct.md, "Train as you draft: equal compute"): continuing the shipped EDD drafter, 3 steps did worse
than teacher forcing at equal compute on every validation and replay figure; the default stays 1.
"""

from __future__ import annotations

import math

import torch

from hf_specdec.errors import SpecDecError

DEFAULT_DECAY = 0.8  # EAGLE-3's per-step weight


def step_weights(steps: int, decay: float = DEFAULT_DECAY) -> list[float]:
    """The ``steps`` loss weights ``decay ** k`` (k = 0 .. steps - 1), normalised to sum to 1; ``[1.0]`` for 1 step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise SpecDecError(
            f"ttt_steps (--ttt-steps) must be an integer >= 1 (1 = teacher forcing), got {steps!r}"
        )
    if (
        isinstance(decay, bool)
        or not isinstance(decay, (int, float))
        or not (math.isfinite(decay) and decay > 0)
    ):
        raise SpecDecError(f"ttt_decay (--ttt-decay) must be a finite number > 0, got {decay!r}")
    raw = [float(decay) ** k for k in range(steps)]
    total = sum(raw)
    return [w / total for w in raw]


def feed_back(input_ids: torch.Tensor, predicted: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
    """The next step's inputs: ``input_ids`` (B, n) with position ``i`` replaced by ``predicted[:, i - 1]`` (the token
    predicted at ``i - 1``; ``predicted`` is (B, n - 1)) wherever ``drafted[i]``."""
    fed = input_ids.clone()
    fed[:, 1:] = torch.where(drafted[1:], predicted, input_ids[:, 1:])
    return fed


def unrolled_steps(model, drafter, input_ids: torch.Tensor, first: dict, steps: int):
    """Yield the results of ``steps`` unrolled steps after ``first`` (``DrafterTrainer._forward``'s result of the
    teacher-forced pass: ``logits`` at the supervised positions ``select``, ``hidden``, ``context`` and the teacher),
    each with its own ``logits``, ``hidden`` and inputs ``fed_ids``, the rest (teacher, gold tokens) shared. Step k's
    inputs at the drafted positions are step k - 1's greedy predictions (argmax over the draft vocabulary, no
    gradient); its pass goes through ``model`` (a DDP wrapper syncs it) with ``drafter.unrolled_inputs``."""
    if steps < 1:
        return
    drafted = drafter.drafted_positions(input_ids, first["context"])
    n, select, prev = input_ids.shape[1], first["select"], first
    for _ in range(steps):
        with torch.no_grad():
            predicted = torch.zeros_like(input_ids[:, 1:])  # draft-vocabulary argmax at positions 0 .. n-2
            predicted[select] = prev["logits"].argmax(-1)
            rest = drafted[1:].expand_as(select) & ~select  # unsupervised positions that feed a drafted one
            if bool(rest.any()):
                predicted[rest] = drafter.draft_logits(prev["hidden"][:, :-1][rest]).argmax(-1)
            if drafter.draft_vocab_ids is not None:
                predicted = drafter.draft_vocab_ids[predicted]
            fed = feed_back(input_ids, predicted, drafted)
        inputs = drafter.unrolled_inputs(input_ids, fed, prev["context"])
        hidden = model(**inputs, return_hidden_states=True)[:, -n:]
        logits = drafter.draft_logits(hidden[:, :-1][select]).float()
        prev = {**prev, "logits": logits, "hidden": hidden, "fed_ids": fed}
        yield prev


def unrolled_loss(step_losses: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """``sum_k w_k L_k`` (the weights sum to 1); the one loss itself for a single step."""
    if len(step_losses) != len(weights):
        raise ValueError(f"{len(step_losses)} step losses for {len(weights)} weights")
    if len(step_losses) == 1:
        return step_losses[0]
    return sum(w * loss for w, loss in zip(weights, step_losses))
