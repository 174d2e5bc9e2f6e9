"""hf_specdec: lossless speculative decoding for Hugging Face transformers.

One import, one keyword::

    target.generate(**inputs, assistant_model=drafter)            # GLIDE / EDD drafters (chains)
    target.generate(**inputs, custom_generate=hf_specdec.pld_plus) # PLD+ (arXiv:2412.01447)
    target.generate(**inputs, custom_generate=hf_specdec.space)    # SPACE auto-correct decoding (SPACE, arXiv:2402.11809)
                                  # on a SAR-SFT model, e.g. the shipped one: hf_specdec.load_space_model()
    target.generate(**inputs, custom_generate=hf_specdec.glide_cape, drafter=glide)  # GLIDE + CAPE trees
    target.generate(**inputs, custom_generate=hf_specdec.edd_pct, drafter=edd)       # EDD + PCT trees
    target.generate(**inputs, custom_generate=hf_specdec.tree_generate, proposer=...)  # any token-tree proposer
    hf_specdec.apply_kernels(target)  # CPU: linear layers on oneDNN's prepacked kernels (hf_specdec/kernels.py)

Importing registers the drafters with the Auto classes and installs the hooks into transformers' assisted loop
(``hf_specdec.core.assisted``: an hf_specdec drafter as ``assistant_model`` runs the tree core's loop; every other call
is transformers' own).

Layout: ``core/`` (the verification core every method shares), one package per method (``pld_plus/``,
``glide/``, ``edd/``, ``space/``), ``bench/``, ``cli/``. ``hf_specdec.pld_plus`` and ``hf_specdec.space`` name the
``custom_generate`` functions of the packages of the same name (bound below, after the packages are imported).
"""

from . import modeling  # noqa: F401  (Auto-class registration of the drafters)
from .core import assisted
from .core.tree import TokenTree
from .core.tree_decoding import TreeProposer, tree_generate
from .edd import edd_pct
from .errors import SpecDecError
from .glide import glide_cape
from .kernels import apply_kernels, restore_kernels
from .pld_plus import pld_plus
from .space import space_generate as space
from .space.adapter import load_space_model
from .target import load_default_target, load_target

assisted.install()

__version__ = "0.1.0"

__all__ = [
    "SpecDecError",
    "TokenTree",
    "TreeProposer",
    "apply_kernels",
    "edd_pct",
    "glide_cape",
    "load_default_target",
    "load_space_model",
    "load_target",
    "pld_plus",
    "restore_kernels",
    "space",
    "tree_generate",
    "__version__",
]
