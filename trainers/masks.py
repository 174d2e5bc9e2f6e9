"""Attention masks used only in drafter training.

``blockwise_cross_mask`` is GLIDE's block-wise cross-attention mask (glide-cape.txt §4.1): the training sequence
is cut into blocks of L tokens (L = 5 in the paper) and a draft query at position j may attend to the target's
keys/values at position k only if ``block(j) > block(k)``, with ``block(x) = x // L``. This reproduces the KV
delay of inference, where the drafter proposing token t+i only sees the target's cache up to t-1.
"""

from __future__ import annotations

import torch


def blockwise_cross_mask(
    length: int, block_size: int = 5, device: torch.device | str | None = None
) -> torch.Tensor:
    """Bool (length, length): True where query j may attend target position k, i.e. ``j // L > k // L``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    block = torch.arange(length, device=device) // block_size
    return block[:, None] > block[None, :]
