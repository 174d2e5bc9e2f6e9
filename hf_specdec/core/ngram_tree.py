"""The n-gram lookup tree proposer (``tree-lookup``): prompt lookup decoding grown into a token tree.

The continuations that followed the most recent earlier occurrences of the context's last n-gram (n =
``max_ngram`` down to 1) are merged into a trie, plus ``random_siblings`` random tokens under the root (useless as
drafts, there to make every step a real tree). It needs no drafter, so it is the tree core's test proposer, the
bench's ``tree-lookup`` method and the tree method that ``hf-specdec export-custom-generate`` can share.
"""

from __future__ import annotations

import torch

from .tree import ROOT, TokenTree
from .tree_decoding import TreeProposer


class NGramTreeProposer(TreeProposer):
    """Deterministic drafts (``draft_probs=None``), so greedy and sampling verification are both lossless."""

    def __init__(
        self,
        max_ngram: int = 3,
        num_tokens: int = 10,
        branches: int = 4,
        max_nodes: int = 48,
        random_siblings: int = 2,
        seed: int = 0,
    ):
        self.max_ngram, self.num_tokens, self.branches = max_ngram, num_tokens, branches
        self.max_nodes, self.random_siblings, self.seed = max_nodes, random_siblings, seed
        self.vocab_size = 0

    def start(self, model, input_ids, generation_config) -> None:
        head = model.get_output_embeddings()
        self.vocab_size = getattr(head, "out_features", None) or head.weight.shape[0]
        self.rng = torch.Generator().manual_seed(self.seed)

    def continuations(self, ids: torch.Tensor) -> list[list[int]]:
        """Up to ``branches`` continuations after earlier matches of the last n-gram, longest n and most recent first."""
        seq, out = ids.tolist(), []
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            windows = ids[:-1].unfold(0, n, 1)  # windows ending before the last token
            hits = (windows == ids[-n:]).all(dim=1).nonzero().flatten().tolist()
            for start in reversed(hits):
                cont = seq[start + n : start + n + self.num_tokens]
                if cont and cont not in out:
                    out.append(cont)
                if len(out) >= self.branches:
                    return out
        return out

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        index: dict[tuple[int, int], int] = {}
        for cont in self.continuations(input_ids[0].cpu()):
            parent = ROOT
            for token in cont[:max_depth]:
                if (parent, token) not in index:
                    if len(index) >= self.max_nodes:
                        break
                    index[(parent, token)] = len(index)
                parent = index[(parent, token)]
        if max_depth >= 1:
            draws = torch.randint(
                self.vocab_size, (self.random_siblings,), generator=self.rng, device=self.rng.device
            )
            for token in draws.tolist():
                if (ROOT, token) not in index and len(index) < self.max_nodes:
                    index[(ROOT, token)] = len(index)
        if not index:
            return TokenTree.empty(input_ids.device)
        # dicts keep insertion order, so parents come first; the tree is built on the input's device (the loop's)
        device = input_ids.device
        return TokenTree(
            torch.tensor([token for _, token in index], dtype=torch.long, device=device),
            torch.tensor([parent for parent, _ in index], dtype=torch.long, device=device),
        )
