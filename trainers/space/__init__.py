"""SPACE's SAR-SFT (``hf-specdec train space``, ``train.py``): a causal LM fine-tuned through a plain
``transformers.Trainer`` (LoRA by default) on ShareGPT answers, or a ``--corpus``, whose inputs have spans of ``k``
mask tokens ``[M]`` (``collator.py``), so that at each mask it guesses a token further ahead: what SPACE's
auto-correct decoding (``hf_specdec.space``) drafts from. ``eval.py`` scores the masks' held-out top-1 and
``card.py`` writes the model card with the measured tau."""
