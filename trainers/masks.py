"""Moved to ``modeling/masks.py`` (issue 33: ``modeling/`` imports no trainer). This re-export serves only
``modeling/glide.py`` until it imports ``hf_specdec.modeling.masks``; delete this file then."""

from hf_specdec.modeling.masks import blockwise_cross_mask, dual_block_mask

__all__ = ["blockwise_cross_mask", "dual_block_mask"]
