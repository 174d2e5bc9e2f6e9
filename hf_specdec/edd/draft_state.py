"""EDD's own KV cache during decoding (edd-pct.txt §3.1, Fig. 3a): ``[soft prompt ; this round]``.

The soft-prompt part grows only with verified tokens (the target's hidden states of layer ``encoder_layer``), the
round part (root + drafts) is dropped after each verification. Shared by the chain generator, the tree proposer
and ``hf-specdec tree-replay``.
"""

from __future__ import annotations

import torch

from ..core.tree import ROOT, additive_mask
from ..errors import SpecDecError
from .pct import GrownTree


class EddDraftState:
    """EDD's KV cache for one generation: ``prefix`` positions (soft prompt, or committed tokens for the
    ablation) followed by the current round (root + drafts)."""

    def __init__(self, edd):
        self.edd = edd
        self.cache = edd.new_cache()
        self.n_prefix = 0  # positions [0, n_prefix) of the cache are verified prefix
        self.pending: list[
            torch.Tensor
        ] = []  # soft-prompt vectors (1, m, D) for the positions after n_prefix
        self.forwards = 0
        self.fed_nodes: list[
            int
        ] = []  # tree nodes in the round part of the cache, in cache order (after the root)

    @property
    def soft_prompt(self) -> bool:
        return bool(self.edd.config.soft_prompt)

    def push_hidden(self, hidden: torch.Tensor) -> None:
        """Soft-prompt vectors (1, m, D) of the next m verified positions."""
        if hidden.shape[1]:
            self.pending.append(hidden)

    def known(self) -> int:
        return self.n_prefix + sum(h.shape[1] for h in self.pending)

    def root_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Start a round at the root ``input_ids[0, -1]``: drop the last round, append the new verified prefix,
        feed the root. Returns EDD's final hidden state at the root, (1, D)."""
        length = input_ids.shape[1]
        extra = self.cache.get_seq_length() - self.n_prefix
        if extra > 0:
            self.cache.crop(-extra)
        if not self.soft_prompt:  # ablation: the prefix is the committed tokens themselves
            self.pending = [self.edd.embed(input_ids[:, self.n_prefix : length - 1])]
        if self.known() != length - 1:
            raise SpecDecError(
                f"EDD soft prompt covers {self.known()} positions but {length - 1} tokens are verified; the target's "
                "hidden states of some verified tokens were not passed to the drafter"
            )
        device = self.edd.decoder.norm.weight.device
        vecs = torch.cat(
            [*(h.to(device) for h in self.pending), self.edd.embed(input_ids[:, -1:].to(device))], dim=1
        )
        positions = torch.arange(self.n_prefix, length, device=device)[None]
        hidden = self.edd.decode(vecs, positions, self.cache)
        self.n_prefix, self.pending, self.fed_nodes = length - 1, [], []
        self.forwards += 1
        return hidden[:, -1]

    def chain_step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Feed one draft token (causal after the cache); returns the hidden state (1, D)."""
        device = self.edd.decoder.norm.weight.device
        pos = torch.tensor([[position]], device=device)
        hidden = self.edd.decode(self.edd.embed(token.reshape(1, 1).to(device)), pos, self.cache)
        self.forwards += 1
        return hidden[:, -1]

    def tree_step(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        """Feed the tokens of tree ``nodes`` (all children of already-fed nodes or of the root) in one forward,
        each seeing the prefix, the root, its fed ancestors and itself; returns their hidden states (m, D)."""
        device = self.edd.decoder.norm.weight.device
        base = self.n_prefix + 1  # prefix + root
        slot = {node: base + i for i, node in enumerate(self.fed_nodes)}
        cache_len = base + len(self.fed_nodes)
        m = len(nodes)
        mask = torch.zeros(m, cache_len + m, dtype=torch.bool)
        mask[:, :base] = True
        for row, node in enumerate(nodes):
            mask[row, cache_len + row] = True
            parent = tree.parents[node]
            while parent != ROOT:
                mask[row, slot[parent]] = True
                parent = tree.parents[parent]
        tokens = torch.tensor([[tree.tokens[n] for n in nodes]], device=device)
        positions = torch.tensor([[self.n_prefix + tree.depth[n] for n in nodes]], device=device)
        attn = additive_mask(mask.to(device), self.edd.dtype)[None, None]
        hidden = self.edd.decode(self.edd.embed(tokens), positions, self.cache, attention_mask=attn)
        self.fed_nodes += nodes
        self.forwards += 1
        return hidden[0]
