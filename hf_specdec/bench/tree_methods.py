"""Bench method ``tree-lookup``: the trivial tree proposer that exercises the tree verification core.

Prompt lookup decoding (Saxena 2023; HF's ``prompt_lookup_num_tokens``) grown into a tree: the
continuations that followed the most recent earlier occurrences of the context's last n-gram
(n = ``max_ngram`` down to 1) are merged into a trie, plus ``random_siblings`` random tokens under the root
(useless as drafts, there to make every step a real tree). Options (``--option k=v``): ``tree_ngram``,
``tree_tokens`` (continuation length), ``tree_branches`` (matches used), ``tree_nodes`` (node cap),
``tree_random`` (random root siblings).
"""

from __future__ import annotations

import torch

from ..core.tree import ROOT, TokenTree
from ..core.tree_decoding import TreeProposer, tree_generate
from .methods import Method, greedy_with_stats, register


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
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
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
            for token in torch.randint(self.vocab_size, (self.random_siblings,), generator=self.rng).tolist():
                if (ROOT, token) not in index and len(index) < self.max_nodes:
                    index[(ROOT, token)] = len(index)
        if not index:
            return TokenTree.empty(input_ids.device)
        return TokenTree.from_additions(index)  # dicts keep insertion order: parents come first


@register
class TreeLookup(Method):
    name = "tree-lookup"
    description = "n-gram prompt-lookup tree + random siblings, verified by the tree core (greedy)"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        o = ctx.options
        self.proposer = NGramTreeProposer(
            max_ngram=int(o.get("tree_ngram", 3)),
            num_tokens=int(o.get("tree_tokens", 10)),
            branches=int(o.get("tree_branches", 4)),
            max_nodes=int(o.get("tree_nodes", 48)),
            random_siblings=int(o.get("tree_random", 2)),
        )

    def generate(self, input_ids, max_new_tokens):
        return greedy_with_stats(
            self.model,
            input_ids,
            max_new_tokens,
            custom_generate=tree_generate,
            proposer=self.proposer,
        )
