"""GLIDE + CAPE, the generation side: Du et al., "GLIDE with a CAPE: A Low-Hassle Method to Accelerate Speculative
Decoding" (arXiv:2402.02082), §3, §4.1 GLIDE, §4.2 CAPE.

- ``cape.py``: CAPE, confidence-aware proposal expansion (§4.2), verified as one token tree per target forward by
  the tree core (``target.generate(**inputs, custom_generate=hf_specdec.glide_cape, drafter=glide)``), and GLIDE's
  chain (§4.1), CAPE without expansion sets (``target.generate(**inputs, assistant_model=glide)``);
  ``expansion.py``: its S(p) table, the expansion sets from one draft distribution, and their tree.
- ``draft_cache.py``: :class:`GlideDraftCache`, the drafter's own self-attention cache across steps.

The drafter is ``modeling/glide.py`` (``hf_specdec.modeling.GlideForCausalLM``, §4.1; block-wise cross-attention
mask in ``modeling/masks.py``); it is trained by ``hf-specdec train glide``.
"""

from .cape import CapeProposer, glide_cape
from .draft_cache import GlideDraftCache

__all__ = ["CapeProposer", "GlideDraftCache", "glide_cape"]
