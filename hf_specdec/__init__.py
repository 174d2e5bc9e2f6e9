"""hf_specdec: lossless speculative decoding for Hugging Face transformers.

One import, one keyword: ``target.generate(**inputs, assistant_model=drafter)`` or
``target.generate(**inputs, custom_generate=hf_specdec.<loop>)``.
"""

from .errors import SpecDecError
from .target import load_default_target, load_target

__version__ = "0.1.0"

__all__ = ["SpecDecError", "load_default_target", "load_target", "__version__"]

from . import assisted, modeling  # noqa: E402, F401  (drafters' candidate generators; Auto-class registration)

assisted.install()

from .pld_plus import pld_plus  # noqa: E402  (PLD+ custom_generate; the name is the function, not the submodule)

__all__ += ["pld_plus"]


def __getattr__(name: str):
    """Lazy exports: ``hf_specdec.space`` (SPACE auto-correct ``custom_generate``; a callable module)."""
    if name == "space":
        import importlib

        return importlib.import_module(".space", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
