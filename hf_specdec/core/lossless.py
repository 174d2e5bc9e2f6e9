"""The losslessness check shared by every method: compare an output with plain greedy ``generate``.

In fp32 the two must be token-identical. In bf16/fp16, different (but equally correct) kernel shapes
round differently, so a divergence counts as lossless only when, at the first differing position, the
target's logits of both tokens are within the tolerance of the top logit (a measured near-tie);
anything else is a bug. The tolerance is ``tie_tol`` or two units in the last place of the model's dtype at the
top logit, whichever is larger (:func:`tie_tolerance`): a bf16 logit of 32 or more is only resolved to 0.25.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..options import TIE_TOL_BY_DTYPE

# bf16 keeps 8 significant bits: a logit around 16-32 is only resolved to 0.125, and the verify
# forward (many tokens at once) rounds differently from one-token decoding.
DEFAULT_TIE_TOL = {
    torch.float32: TIE_TOL_BY_DTYPE["fp32"],
    torch.bfloat16: TIE_TOL_BY_DTYPE["bf16"],
    torch.float16: TIE_TOL_BY_DTYPE["fp16"],
}


def tie_tolerance(tie_tol: float, top: float, dtype: torch.dtype) -> float:
    """``tie_tol``, or two units in the last place of ``dtype`` at the top logit ``top`` if that is larger.

    bf16's unit at a logit in [16, 32) is 0.125, so there the default 0.25 is two units; at [32, 64) it is 0.25, and
    one rounding step of each logit already makes a gap of 0.25-0.5 (measured: HumanEval/6 on SmolLM2-135M in bf16,
    top-two gap 0.29 in fp32, 0.375 in bf16 at a top logit of 32)."""
    if abs(top) < 1e-30 or not dtype.is_floating_point:
        return tie_tol
    unit = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(top)))
    return max(tie_tol, 2.0 * unit)


@dataclass
class Verdict:
    identical: bool
    lossless: bool
    first_diff: int | None = None
    gap: float | None = None  # max(top - logit[ref token], top - logit[out token]) at first_diff
    reason: str = ""


@torch.no_grad()
def compare_outputs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    reference: list[int],
    output: list[int],
    tie_tol: float | None,
) -> Verdict:
    """Verdict for ``output`` against the greedy ``reference`` (both new tokens only, prompt excluded).

    ``tie_tol=None`` demands token identity (fp32).
    """
    if reference == output:
        return Verdict(identical=True, lossless=True)
    d = next((i for i, (a, b) in enumerate(zip(reference, output)) if a != b), None)
    if d is None:  # one is a strict prefix of the other: stopped early or ran on; never a tie
        return Verdict(
            False,
            False,
            min(len(reference), len(output)),
            None,
            f"length differs ({len(output)} vs {len(reference)} tokens) with no token difference",
        )
    if tie_tol is None:
        return Verdict(
            False, False, d, None, f"token {d} differs ({output[d]} vs reference {reference[d]}) in fp32"
        )
    prefix = torch.cat(
        [
            prompt_ids.reshape(1, -1).to(model.device),
            torch.tensor([reference[:d]], dtype=torch.long, device=model.device),
        ],
        dim=1,
    )
    logits = model(input_ids=prefix).logits[0, -1].float()
    top = logits.max().item()
    gap = max(top - logits[reference[d]].item(), top - logits[output[d]].item())
    tol = tie_tolerance(tie_tol, top, model.dtype)
    if gap <= tol:
        return Verdict(False, True, d, gap, f"near-tie at token {d} (gap {gap:.3f} <= {tol})")
    return Verdict(False, False, d, gap, f"token {d} differs at a non-tie (gap {gap:.3f} > {tol})")
