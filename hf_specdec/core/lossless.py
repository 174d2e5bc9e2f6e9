"""The losslessness check shared by every method: compare an output with plain greedy ``generate``.

In fp32 the two must be token-identical. In bf16/fp16, different (but equally correct) kernel shapes
round differently, so a divergence counts as lossless only when, at the first differing position, the
target's logits of both tokens are within ``tie_tol`` of the top logit (a measured near-tie);
anything else is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# bf16 keeps 8 significant bits: a logit around 16-32 is only resolved to 0.125, and the verify
# forward (many tokens at once) rounds differently from one-token decoding.
DEFAULT_TIE_TOL = {torch.float32: None, torch.bfloat16: 0.25, torch.float16: 0.05}


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
    if gap <= tie_tol:
        return Verdict(False, True, d, gap, f"near-tie at token {d} (gap {gap:.3f} <= {tie_tol})")
    return Verdict(False, False, d, gap, f"token {d} differs at a non-tie (gap {gap:.3f} > {tie_tol})")
