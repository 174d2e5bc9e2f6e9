"""Bench method ``tree-lookup``: the n-gram lookup tree proposer (``core/ngram_tree.py``) verified by the tree core.

Options (``--option k=v``): ``tree_ngram``, ``tree_tokens`` (continuation length), ``tree_branches`` (matches
used), ``tree_nodes`` (node cap), ``tree_random`` (random root siblings).
"""

from __future__ import annotations

from ..core.ngram_tree import NGramTreeProposer
from ..core.tree_decoding import tree_generate
from .methods import GenerateCallMethod, register


@register
class TreeLookup(GenerateCallMethod):
    name = "tree-lookup"
    description = "n-gram prompt-lookup tree + random siblings, verified by the tree core (greedy)"
    stats_kwarg = True
    batchable = True

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

    def generate_kwargs(self) -> dict:
        return dict(custom_generate=tree_generate, proposer=self.proposer)
