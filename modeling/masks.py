"""The training-time attention masks and drafted positions of the drafters (their training forward passes build
them, so they live with the models; ``trainers/`` imports them from here).

``blockwise_cross_mask`` is GLIDE's block-wise cross-attention mask (GLIDE, arXiv:2402.02082, §4.1): the training sequence
is cut into blocks of L tokens (L = 5 in the paper) and a draft query at position j may attend to the target's
keys/values at position k only if ``block(j) > block(k)``, with ``block(x) = x // L``. This reproduces the KV
delay of inference, where the drafter proposing token t+i only sees the target's cache up to t-1.
``dual_block_mask`` is EDD's dual-block mask (and GLIDE's unrolled self-attention mask); ``drafted_positions`` says
which inputs of a block are, at inference, the drafter's own drafts (``trainers/drafters/unrolled.py``).
"""

from __future__ import annotations

import torch

from hf_specdec.errors import SpecDecError


def blockwise_cross_mask(
    length: int, block_size: int = 5, device: torch.device | str | None = None
) -> torch.Tensor:
    """Bool (length, length): True where query j may attend target position k, i.e. ``j // L > k // L``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    block = torch.arange(length, device=device) // block_size
    return block[:, None] > block[None, :]


def dual_block_mask(length: int, block_length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """EDD's dual-block attention mask (EDD, ACL 2025, §3.1, Fig. 3a, eq. 3): bool ``(2 * length, 2 * length)``,
    True = may attend; rows/cols ``[soft prompt h_0..h_{n-1} ; tokens x_0..x_{n-1}]`` (h_k and x_k share position k).

    Token ``x_i`` of block ``j = i // L`` sees the soft prompt ``h_k`` for ``k < j * L`` (hidden states of blocks
    0..j-1, what the target has verified when that drafting round starts; ``x_{jL}`` is the round's last committed
    token) and the tokens of its own block up to itself. Soft-prompt rows are causal among themselves, as the
    soft-prompt part of EDD's KV cache is built at inference. Block 0's tokens see no soft prompt.

    The same pattern is GLIDE's self-attention mask over ``[data tokens ; fed-back tokens]`` in an unrolled training
    step (``trainers/drafters/unrolled.py``): a fed-back token of block j sees the data (verified) tokens before its
    round and the fed-back tokens of its round up to itself; the data rows are the ordinary causal pass.
    """
    if block_length < 1:
        raise ValueError(f"block_length must be >= 1, got {block_length}")
    idx = torch.arange(length, device=device)
    causal = idx[None, :] <= idx[:, None]
    start = (idx // block_length) * block_length  # first token of each token's block
    soft_for_tokens = idx[None, :] < start[:, None]
    tokens_for_tokens = causal & (idx[None, :] >= start[:, None])
    top = torch.cat([causal, torch.zeros_like(causal)], dim=1)
    bottom = torch.cat([soft_for_tokens, tokens_for_tokens], dim=1)
    return torch.cat([top, bottom], dim=0)


def drafted_positions(length: int, block_length: int, device=None) -> torch.Tensor:
    """Bool ``(length,)``: True where the input is, at inference, the drafter's own previous draft (every position of
    a block of ``block_length`` but its first, the round's committed token)."""
    if block_length < 1:
        raise SpecDecError(f"block length must be >= 1, got {block_length}")
    return torch.arange(length, device=device) % block_length != 0
