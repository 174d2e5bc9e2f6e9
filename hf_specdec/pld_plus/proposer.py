"""PLD+ drafting as a tree-core ``TreeProposer`` (a chain): how ``hf_specdec.pld_plus`` runs both variants, at batch
1 and, for PLD+(h), on a batch.

Each proposer wraps its own :class:`PLDPlusCandidateGenerator` and replays the assisted-decoding calls on it:
``propose`` is ``get_candidates`` with the artifacts of the last verification (hidden state ``l``, or the induction
heads' attention rows, of the tokens it added to the cache: the root and the accepted draft tokens), ``observe`` is
``update_candidate_strategy`` with the number of accepted tokens. Occurrence ranking, the adaptive draft length and
the copied spans are therefore per row and the same as PLD+'s alone (``tests/test_batching.py`` checks equal drafts
and forwards on one row). In a batch each row's draft length is chosen on the batch's cost curve, and
:meth:`expected_tokens` lets the loop cut the drafts to the width that pays for the whole batch
(``batch_decoding.best_depth``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from ..core.tree import TokenTree
from ..core.tree_decoding import StepFeedback, TreeProposer
from .candidate_generator import PLDPlusCandidateGenerator

# PLD+(a)'s verification forwards also compute the selected heads' attention weights: a cost curve of their own
ATTENTION_CURVE = "pld+(a) attention capture"


def cost_variant(variant: str) -> str:
    """The cost curve (``verify_cost.curve_key``'s variant) the verification forwards of PLD+ ``variant`` feed."""
    return ATTENTION_CURVE if variant == "attention" else ""


class PLDPlusProposer(TreeProposer):
    """PLD+ for the tree core. ``make_generator()`` builds a fresh :class:`PLDPlusCandidateGenerator` of ``variant``
    (``"hidden"`` or ``"attention"``; one per row and generation, in ``start``). PLD+(a)'s forwards also compute the
    heads' weights, so they feed a cost curve of their own (:data:`ATTENTION_CURVE`)."""

    def __init__(self, make_generator: Callable[[], PLDPlusCandidateGenerator], variant: str = "hidden"):
        self.make_generator = make_generator
        self.needs_hidden_states = variant == "hidden"
        self.needs_attentions = variant == "attention"
        self.cost_variant = cost_variant(variant)
        self.generator: PLDPlusCandidateGenerator | None = None
        self._outputs = None
        self._drafted = 0  # tokens in the last draft

    def start(self, model, input_ids, generation_config) -> None:
        self.generator = self.make_generator()
        self.generator.extend(input_ids[0].tolist())  # the prompt, read once; then the tokens each step emits
        self._outputs = None
        if self.needs_hidden_states:
            self.hidden_layers = (self.generator.layer,)  # the layer PLD+(h) ranks by: the only one read

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.tree is not None:  # the batch may have cut the draft (batch_decoding.best_depth)
            self.generator.cut_draft(len(feedback.tree))
        self.generator.extend(feedback.new_tokens)  # on the host already: the generator reads nothing back
        # after every forward, the prefill included
        self.generator.update_candidate_strategy(feedback.input_ids, None, feedback.num_accepted)
        self._outputs = SimpleNamespace(hidden_states=feedback.hidden_states, attentions=feedback.attentions)

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        self.generator.get_candidates(input_ids, model_outputs=self._outputs)
        draft = self.generator.last_draft[:max_depth]  # the host list: the tree is built without a read back
        self._drafted = len(draft)
        return TokenTree.from_chain(draft, device=input_ids.device)

    def expected_tokens(self, depth: int) -> float:
        """Tokens this row's draft yields when cut to ``depth`` (``DraftLength.expected``; 1 without a draft)."""
        k = min(depth, self._drafted)
        return self.generator.lengths.expected(k) if k else 1.0
