"""SPACE, the generation side (space.txt §3.2, Alg. 1, eq. 4-7, Fig. 7): auto-correct decoding as a
``custom_generate`` loop (``decoding.py``; ``hf_specdec.space`` is its :func:`space_generate`).

SPACE has no separate drafter (nothing in ``modeling/``): the model drafts for itself at mask tokens, after
SAR-SFT (semi-autoregressive supervised fine-tuning, §3.1), which is ``trainers/space.py`` (``hf-specdec train
space``) with the collator ``trainers/space_collator.py``. Its one-pass draft-and-verify step is its own; the
acceptance of its candidates is the tree core's (``core/acceptance.py``). ``adapter.py`` loads a SAR-SFT LoRA
adapter (the shipped one by default) onto its base model; ``mask_token.py`` adds ``[M]`` for training and loading.
"""

from .decoding import space_generate

__all__ = ["space_generate"]
