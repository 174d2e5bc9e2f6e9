"""SPACE, the generation side: Yi et al., "Generation Meets Verification: Accelerating Large Language Model Inference
with Smart Parallel Auto-Correct Decoding" (arXiv:2402.11809), §3.2, Alg. 1, eq. 4-7, Fig. 7: auto-correct decoding as
a proposer of the tree core (``decoding.py``; ``hf_specdec.space`` is its :func:`space_generate`).

SPACE has no separate drafter (nothing in ``modeling/``): the model drafts for itself at mask tokens, after
SAR-SFT (semi-autoregressive supervised fine-tuning, §3.1), which is ``trainers/space/train.py`` (``hf-specdec train
space``) with the collator ``trainers/space/collator.py``. Its draft-and-verify step is one forward of the tree core's
loop, whose acceptance (``core/acceptance.py``) verifies its candidates. ``adapter.py`` loads a SAR-SFT LoRA
adapter (the shipped one by default) onto its base model; ``mask_token.py`` adds ``[M]`` for training and loading.
"""

from .decoding import space_generate

__all__ = ["space_generate"]
