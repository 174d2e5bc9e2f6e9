"""Training the drafters that learn from a frozen target, GLIDE (``glide.py``, ``hf-specdec train glide``) and EDD
(``edd.py``, ``train edd``): each is a recipe for the one shared run (``run.py``: target, rows, ``Trainer``,
validation, model card), whose ``DrafterTrainer`` (``trainer.py``) runs the target on every batch (or reads what it
gives from a feature store) and trains the drafter on its losses (``losses.py``; the unrolled train-as-you-draft
loss, ``unrolled.py``). Around it: the command-line options (``options.py``), the model card (``card.py``),
``--eval-only`` (``eval_only.py``), the feature store that runs the target once ahead of training (``features.py``,
``hf-specdec features``), PCT's confidence calibration (``calibration.py``, ``hf-specdec calibrate``) and sizing a
draft vocabulary (``draft_vocab.py``, ``hf-specdec draft-vocab``)."""
