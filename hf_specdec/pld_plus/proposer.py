"""PLD+(h) drafting as a tree-core ``TreeProposer`` (a chain): how ``hf_specdec.pld_plus`` runs PLD+(h), at batch 1
and on a batch (issues #17, #31).

The tree core is one decoding loop for every batch size (``core/tree_decoding.py``), and
it reads the device less than transformers' assisted loop (about 1.7 reads a step against 4.3). PLD+(a) and a bare
:class:`PLDPlusCandidateGenerator` (``assistant_model``-style use) still run transformers' assisted loop. Each
proposer wraps its own candidate generator and replays the assisted loop's calls on it: ``propose`` is
``get_candidates`` with the artifacts of the last verification (hidden state ``l`` of the tokens it added to the
cache, the root and the accepted draft tokens), ``observe`` is ``update_candidate_strategy`` with the number of
accepted tokens. Occurrence ranking, the adaptive draft length and the copied spans are therefore per row and the
same as PLD+'s at batch size 1 (``tests/test_batching.py`` checks equal drafts and forwards on one row). In a batch
each row's draft length is chosen on the batch's cost curve, and :meth:`expected_tokens` lets the batched loop cut
the drafts to the width that pays for the whole batch (``batch_decoding.best_depth``).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from ..core.tree import TokenTree
from ..core.tree_decoding import StepFeedback, TreeProposer
from .candidate_generator import PLDPlusCandidateGenerator


class PLDPlusProposer(TreeProposer):
    """PLD+(h) for the tree core. ``make_generator()`` builds a fresh :class:`PLDPlusCandidateGenerator` (one per
    row and generation, in ``start``)."""

    needs_hidden_states = True

    def __init__(self, make_generator: Callable[[], PLDPlusCandidateGenerator]):
        self.make_generator = make_generator
        self.generator: PLDPlusCandidateGenerator | None = None
        self._outputs = None
        self._drafted = 0  # tokens in the last draft

    def start(self, model, input_ids, generation_config) -> None:
        self.generator = self.make_generator()
        self.generator.extend(input_ids[0].tolist())  # the prompt, read once; then the tokens each step emits
        self._outputs = None
        self.hidden_layers = (self.generator.layer,)  # the layer PLD+(h) ranks by: the only one read

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.tree is not None:  # the batch may have cut the draft (batch_decoding.best_depth)
            self.generator.cut_draft(len(feedback.tree))
        self.generator.extend(feedback.new_tokens)  # on the host already: the generator reads nothing back
        # after every forward, the prefill included, as the assisted loop does
        self.generator.update_candidate_strategy(feedback.input_ids, None, feedback.num_accepted)
        self._outputs = SimpleNamespace(hidden_states=feedback.hidden_states)

    def propose(self, input_ids: torch.Tensor, max_depth: int) -> TokenTree:
        self.generator.get_candidates(input_ids, model_outputs=self._outputs)
        draft = self.generator.last_draft[:max_depth]  # the host list: the tree is built without a read back
        self._drafted = len(draft)
        return TokenTree.from_chain(draft, device=input_ids.device)

    def expected_tokens(self, depth: int) -> float:
        """Tokens this row's draft yields when cut to ``depth`` (``DraftLength.expected``; 1 without a draft)."""
        k = min(depth, self._drafted)
        return self.generator.lengths.expected(k) if k else 1.0
