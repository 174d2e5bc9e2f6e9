"""PLD+'s tuned defaults (PLD+, arXiv:2412.01447, App. B; ``hf-specdec pld-tune``, docs/pld-plus.md "Tuning")."""

# Defaults tuned on the `summarize` task only (`hf-specdec pld-tune`, docs/pld-plus.md "Tuning"): layer 14 of
# SmolLM2's 30 (stored as a fraction of the depth so that it transfers to other depths), adaptive K with the priors
# below, the top 10 heads, and a minimum score (App. B.3's threshold) below which a step does not draft: on a CPU a
# verification forward costs noticeably more per drafted token, so a low-confidence draft loses more than it wins.
DEFAULT_MAX_TOKENS = 64  # adaptive mode's cap on K (DraftLength)
# DraftLength's priors: hit rate of a fresh occurrence, hit rate of a running copy, continuation rate
DEFAULT_PRIORS = (0.4, 0.9, 0.85)
DEFAULT_LAYER_FRACTION = 14 / 30
DEFAULT_TOP_HEADS = 10
DEFAULT_MIN_SCORE = {"hidden": 0.8, "attention": 0.2}
