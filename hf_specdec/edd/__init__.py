"""EDD + PCT, the generation side (edd-pct.txt §3.1 EDD, §3.2 PCT, App. A VCT / EAGLE-2 trees): chains in
transformers' assisted loop, trees in the tree core's ``tree_generate`` loop.

EDD needs the target's hidden states (layer ``EddConfig.encoder_layer``) of every *verified* token:

- **Chain** (``target.generate(**inputs, assistant_model=edd)``): ``hf_specdec.core.assisted`` routes the assistant to
  :class:`EddCandidateGenerator`, which sets ``requires_model_outputs`` and ``model_kwargs_overrides =
  {"output_hidden_states": True}``: transformers' ``_assisted_decoding`` then runs every verification forward with
  hidden states and hands that forward's outputs (``model_outputs``) to the next ``get_candidates`` call. The
  verified positions of that forward are the ones left in the (cropped) target cache, so the generator takes the
  states of positions ``[soft-prompt length, len(input_ids) - 1)`` from it. No other patch of transformers.
- **Tree**: :class:`EddTreeProposer` (a ``core.tree_decoding.TreeProposer`` with ``needs_hidden_states``) gets the
  hidden states of the prompt / the root and accepted nodes in ``StepFeedback.hidden_states`` after every forward.

Either way verification and acceptance are the target's (greedy match, or lossless speculative sampling), so the
output is the target's. :class:`EddDraftState` keeps EDD's own KV cache as ``[soft prompt ; this round]``: the
soft-prompt part grows only with verified tokens, the round part is dropped after each verification (Fig. 3a).
The first round has no soft prompt yet (the target has not run), so the chain drafts nothing there: that forward
is the target's prefill. The ``soft_prompt=False`` ablation keeps the committed tokens instead and drafts at once.

Modules: ``draft_state.py`` (EDD's KV cache), ``candidate_generator.py`` (chains), ``pct.py`` (PCT and the
baseline trees, eq. 5), ``tree_proposer.py`` (trees in ``tree_generate``), ``generate.py`` (``hf_specdec.edd_pct``:
PCT trees in one ``custom_generate`` call), ``tree_replay.py`` (``hf-specdec tree-replay``), ``checkpoint.py`` (where
an unnamed EDD checkpoint is found). The drafter is ``modeling/edd.py``
(``hf_specdec.modeling.EddForCausalLM``; dual-block mask ``modeling/masks.py``); its training is
``trainers/edd.py`` (``hf-specdec train edd``: KL loss eq. 4 ``trainers/losses.py``) and
``trainers/calibration.py`` (confidence temperature for PCT).

Usage::

    target.generate(**inputs, assistant_model=edd)                                    # chain
    target.generate(**inputs, custom_generate=hf_specdec.edd_pct, drafter=edd)        # PCT tree (generate.py)
    target.generate(**inputs, custom_generate=hf_specdec.tree_generate, proposer=EddTreeProposer(edd, "vct"))
"""

from .candidate_generator import EddCandidateGenerator
from .draft_state import EddDraftState
from .generate import edd_pct
from .tree_proposer import EddTreeProposer

__all__ = ["EddCandidateGenerator", "EddDraftState", "EddTreeProposer", "edd_pct"]
