"""EDD + PCT, the generation side: "Faster Speculative Decoding via Effective Draft Decoder with Pruned Candidate
Tree" (ACL 2025), §3.1 EDD, §3.2 PCT, App. A VCT / EAGLE-2 trees, all in the tree core's ``tree_generate`` loop.

EDD needs the target's hidden states (layer ``EddConfig.encoder_layer``) of every *verified* token:
:class:`EddTreeProposer` (a ``TreeProposer`` with ``needs_hidden_states``) gets the hidden states of the prompt / the
root and accepted nodes in ``StepFeedback.hidden_states`` after every forward. The chain
(``target.generate(**inputs, assistant_model=edd)``) is the same proposer drafting a tree of width 1
(``modeling/edd.py``'s ``make_tree_proposer``).

Verification and acceptance are the target's (greedy match, or lossless speculative sampling), so the
output is the target's. :class:`EddDraftState` keeps EDD's own KV cache as ``[soft prompt ; this round]``: the
soft-prompt part grows only with verified tokens, the round part is dropped after each verification (Fig. 3a).
The first round has no soft prompt yet (the target has not run), so nothing is drafted there: that forward is
the target's prefill. The ``soft_prompt=False`` ablation keeps the committed tokens instead and drafts at once.

Modules: ``draft_state.py`` (EDD's KV cache), ``pct.py`` (PCT and the
baseline trees, eq. 5), ``tree_proposer.py`` (trees in ``tree_generate``), ``generate.py`` (``hf_specdec.edd_pct``:
PCT trees in one ``custom_generate`` call), ``tree_replay.py`` (``hf-specdec tree-replay``), ``checkpoint.py`` (where
an unnamed EDD checkpoint is found). The drafter is ``modeling/edd.py``
(``hf_specdec.modeling.EddForCausalLM``; dual-block mask ``modeling/masks.py``); its training is
``trainers/drafters/edd.py`` (``hf-specdec train edd``: KL loss eq. 4 ``trainers/drafters/losses.py``) and
``trainers/drafters/calibration.py`` (confidence temperature for PCT).

Usage::

    target.generate(**inputs, assistant_model=edd)                                    # chain
    target.generate(**inputs, custom_generate=hf_specdec.edd_pct, drafter=edd)        # PCT tree (generate.py)
    target.generate(**inputs, custom_generate=hf_specdec.tree_generate, proposer=EddTreeProposer(edd, "vct"))
"""

from .draft_state import EddDraftState
from .generate import edd_pct
from .tree_proposer import EddTreeProposer

__all__ = ["EddDraftState", "EddTreeProposer", "edd_pct"]
