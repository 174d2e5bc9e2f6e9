"""hf_specdec: lossless speculative decoding for Hugging Face transformers.

One import, one keyword::

    target.generate(**inputs, assistant_model=drafter)            # GLIDE / EDD drafters (chains)
    target.generate(**inputs, custom_generate=hf_specdec.pld_plus) # PLD+ (pld-plus.txt)
    target.generate(**inputs, custom_generate=hf_specdec.space)    # SPACE auto-correct decoding (space.txt)
    target.generate(**inputs, custom_generate=hf_specdec.glide_cape, drafter=glide)  # GLIDE + CAPE trees
    target.generate(**inputs, custom_generate=hf_specdec.tree_generate, proposer=...)  # any token-tree proposer

Importing registers the drafters with the Auto classes and installs the one hook into transformers'
assisted loop (``hf_specdec.assisted``).
"""

from . import assisted, modeling  # noqa: F401  (Auto-class registration of the drafters)
from .cape import glide_cape
from .errors import SpecDecError
from .pld_plus_generation import pld_plus
from .space_generation import space_generate as space
from .target import load_default_target, load_target
from .tree import TokenTree
from .tree_decoding import TreeProposer, tree_generate

assisted.install()

__version__ = "0.1.0"

__all__ = [
    "SpecDecError",
    "TokenTree",
    "TreeProposer",
    "glide_cape",
    "load_default_target",
    "load_target",
    "pld_plus",
    "space",
    "tree_generate",
    "__version__",
]
