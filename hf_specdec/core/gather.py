"""What a verification forward hands on besides its logits, gathered to the rows the step kept.

A forward verifies ``[root, tree]`` (or the prompt); the cache keeps the root and the accepted nodes. Proposers that
read the forward's hidden states or attention maps (EDD, PLD+), and ``generate``'s ``output_hidden_states`` /
``output_attentions``, see only those kept rows, in sequence order, as if the accepted tokens had been fed alone.
"""

from __future__ import annotations

import bisect

import torch

from .generate_io import GenerateOutputs


def gather_attentions(attentions, prefix_length: int, kept: list[int], keep: torch.Tensor, fed: int) -> tuple:
    """Rows ``kept`` (fed indices, ascending; ``keep``: the same on the device) and columns ``prefix + kept`` of each
    layer's attention map: the compacted view. A map may hold only the forward's last rows (PLD+(a)'s capture of its
    induction heads, ``pld_plus/attention_capture.py``): it gives the kept rows it holds. A layer without a map stays
    ``None``."""
    cols = torch.cat([torch.arange(prefix_length, device=keep.device), prefix_length + keep])
    gathered = []
    for a in attentions:
        if a is None:
            gathered.append(None)
            continue
        skip = fed - a.shape[2]  # fed rows the map does not hold (the first ones)
        rows = keep[bisect.bisect_left(kept, skip) :] - skip if skip else keep
        gathered.append(a[:, :, rows.to(a.device)][..., cols.to(a.device)])
    return tuple(gathered)


def gather_hidden(hidden_states, row: int, keep: torch.Tensor, layers) -> tuple:
    """Batch row ``row``'s hidden states at the kept fed rows, per layer; only ``layers`` (``None``: every layer) are
    gathered, the others are ``None`` (a drafter reads one layer: gathering all of them every step is wasted work)."""
    return tuple(
        h[row : row + 1].index_select(1, keep.to(h.device)) if layers is None or i in layers else None
        for i, h in enumerate(hidden_states)
    )


def add_states(outputs: GenerateOutputs, hidden, attn, prefix: int, kept: int, m: int) -> None:
    """Hidden states / attentions of the ``kept`` fed rows per emitted token, as ``_sample`` reports them: the first
    token's entry covers every kept row up to it (the whole prompt for the prefill), each later token its own row."""
    first = kept - m  # kept rows before the first emitting one
    for j in range(m):
        lo, hi = (0 if j == 0 else first + j), first + j + 1
        if outputs.hidden_states is not None:
            outputs.hidden_states.append(tuple(h[:, lo:hi] for h in hidden))
        if outputs.attentions is not None:
            outputs.attentions.append(tuple(a[:, :, lo:hi, : prefix + hi] for a in attn))
