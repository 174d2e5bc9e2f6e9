"""hf_specdec.trainers: the training pipelines, one sub-package each.

``data/`` is what every run reads (ShareGPT in the target's chat template, the pre-tokenized corpus, a drafter run's
rows); ``corpus/`` is ``hf-specdec corpus`` (tokenizing ShareGPT once, and the corpus of the target's own answers);
``drafters/`` trains GLIDE and EDD drafters and tools around them (features, calibration, draft vocabulary);
``space/`` is SPACE's SAR-SFT. ``run_support.py`` is what every training run shares around the ``Trainer``.
"""
