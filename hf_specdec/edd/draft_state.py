"""EDD's own KV cache during decoding (EDD, ACL 2025, §3.1, Fig. 3a): ``[soft prompt ; this round]``.

The soft-prompt part grows only with verified tokens (the target's hidden states of layer ``encoder_layer``), the
round part (root + drafts) is dropped after each verification. Shared by the chain generator, the tree proposer
and ``hf-specdec tree-replay``.
"""

from __future__ import annotations

import torch

from ..core.tree import additive_mask
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
        # ancestry[r, j]: fed node j is the node of row r or one of its ancestors; row 0 is the root (all False,
        # the root is seen through the prefix block), fed node i has row fed_row[node] = i + 1
        self.fed_row: dict[int, int] = {}
        self.ancestry = torch.zeros(64, 64, dtype=torch.bool, device=self.device)

    @property
    def device(self) -> torch.device:
        """The drafter's device: where its cache, its masks and its inputs live."""
        return self.edd.decoder.norm.weight.device

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
        device = self.device
        vecs = torch.cat(
            [*(h.to(device) for h in self.pending), self.edd.embed(input_ids[:, -1:].to(device))], dim=1
        )
        positions = torch.arange(self.n_prefix, length, device=device)[None]
        hidden = self.edd.decode(vecs, positions, self.cache)
        self.n_prefix, self.pending = length - 1, []
        self.fed_nodes, self.fed_row = [], {}
        self.ancestry[:] = False
        self.forwards += 1
        return hidden[:, -1]

    def chain_step(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Feed one draft token (causal after the cache); returns the hidden state (1, D)."""
        device = self.device
        pos = torch.tensor([[position]], device=device)
        hidden = self.edd.decode(self.edd.embed(token.reshape(1, 1).to(device)), pos, self.cache)
        self.forwards += 1
        return hidden[:, -1]

    def level_mask(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        """Boolean ``(m, cache + m)`` mask of feeding ``nodes`` next: each sees the prefix, the root, its fed
        ancestors and itself. A node's row is its parent's ancestry row plus itself: one gather per level, no
        walk up the tree per node. Records the new nodes as fed."""
        base, fed, m = self.n_prefix + 1, len(self.fed_nodes), len(nodes)
        if fed + m + 1 > self.ancestry.shape[0]:  # grow the buffer (a round rarely feeds more than ~60 nodes)
            grown = torch.zeros(2 * (fed + m + 1), 2 * (fed + m + 1), dtype=torch.bool, device=self.device)
            grown[: fed + 1, :fed] = self.ancestry[: fed + 1, :fed]
            self.ancestry = grown
        parent_row = torch.tensor(
            [self.fed_row.get(tree.parents[n], 0) for n in nodes], dtype=torch.long, device=self.device
        )
        rows = self.ancestry[fed + 1 : fed + 1 + m]
        rows[:, :fed] = self.ancestry[parent_row, :fed]
        rows[:, fed : fed + m].fill_diagonal_(True)
        self.fed_row.update({node: fed + 1 + i for i, node in enumerate(nodes)})
        self.fed_nodes += nodes
        mask = torch.ones(m, base + fed + m, dtype=torch.bool, device=self.device)
        mask[:, base:] = rows[:, : fed + m]
        return mask

    def tree_step(self, nodes: list[int], tree: GrownTree) -> torch.Tensor:
        """Feed the tokens of tree ``nodes`` (all children of already-fed nodes or of the root) in one forward,
        each seeing the prefix, the root, its fed ancestors and itself; returns their hidden states (m, D)."""
        device = self.device
        mask = self.level_mask(nodes, tree)
        tokens = torch.tensor([[tree.tokens[n] for n in nodes]], device=device)
        positions = torch.tensor([[self.n_prefix + tree.depth[n] for n in nodes]], device=device)
        attn = additive_mask(mask, self.edd.dtype)[None, None]
        hidden = self.edd.decode(self.edd.embed(tokens), positions, self.cache, attention_mask=attn)
        self.forwards += 1
        return hidden[0]
