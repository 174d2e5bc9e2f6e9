"""GLIDE + CAPE, the generation side (glide-cape.txt §3, §4.1 GLIDE, §4.2 CAPE).

- ``candidate_generator.py``: GLIDE's chain proposals in transformers' assisted loop
  (``target.generate(**inputs, assistant_model=glide)``, §4.1): the drafter cross-attends to the target's verified
  KV cache; :class:`GlideDraftCache` is the drafter's own cache across rounds, shared with CAPE.
- ``cape.py``: CAPE, confidence-aware proposal expansion (§4.2), verified as one token tree per target forward by
  the tree core (``target.generate(**inputs, custom_generate=hf_specdec.glide_cape, drafter=glide)``);
  ``expansion.py``: its S(p) table, the expansion sets from one draft distribution, and their tree.

The drafter is ``modeling/glide.py`` (``hf_specdec.modeling.GlideForCausalLM``, §4.1; block-wise cross-attention
mask in ``modeling/masks.py``); its training is ``trainers/glide.py`` (``hf-specdec train glide``, the shared run in
``trainers/drafter_run.py``).
"""

from .candidate_generator import GlideCandidateGenerator, GlideDraftCache
from .cape import CapeProposer, glide_cape

__all__ = ["CapeProposer", "GlideCandidateGenerator", "GlideDraftCache", "glide_cape"]
