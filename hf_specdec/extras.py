"""The optional parts of hf_specdec (setup.cfg's ``[options.extras_require]``) and the one error a missing one gives.

``pip install hf_specdec`` installs what generation needs: torch, transformers, safetensors, huggingface_hub, numpy
and tqdm. ``import hf_specdec``, every ``custom_generate`` entry point, the drafters of ``hf_specdec.modeling`` (and
their Auto-class registration) and a model folder's loading run on those alone. The rest comes as extras:

- ``train``: ``hf-specdec train ...`` and the other training commands (``calibrate``, ``corpus``, ``features``,
  ``draft-vocab``): peft (SPACE's LoRA), datasets, accelerate (transformers' ``Trainer``), matplotlib (the
  training curve);
- ``bench``: ``hf-specdec bench`` and ``demo``, and the bench tasks (``hf_specdec.tasks``): datasets, evaluate and
  rouge_score (the shipped metrics), matplotlib (the speedup figure), peft (the ``space`` method loads the shipped
  SPACE adapter);
- ``gguf``: de-quantizing a ``.gguf`` file, the named targets' included (once; the converted folder then loads
  without it);
- ``space``: peft alone, to load a SPACE LoRA adapter (``load_space_model``, the shipped one included) for
  ``custom_generate=hf_specdec.space``; a merged SAR-SFT model folder decodes without it.

:func:`require_extra` is the check: where an extra's package is needed, one :class:`SpecDecError` names the extra and
the pip line that installs it. It looks the packages up without importing them (``importlib.util.find_spec``).
"""

from __future__ import annotations

import importlib.util
import sys

from .errors import SpecDecError

# extra -> the modules it installs (their distributions carry the same names), as setup.cfg lists them
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("peft", "datasets", "accelerate", "matplotlib"),
    "bench": ("datasets", "evaluate", "matplotlib", "rouge_score", "peft"),
    "gguf": ("gguf",),
    "space": ("peft",),
}


def installed(module: str) -> bool:
    """Whether the top-level ``module`` can be imported (found on the path, or already imported); ``None`` in
    ``sys.modules`` (an import that is blocked) counts as missing."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def require_extra(extra: str, *modules: str, need: str | None = None) -> None:
    """Raise one :class:`SpecDecError` naming ``extra`` unless every module of ``modules`` (default: all that
    ``EXTRAS[extra]`` holds) is installed. ``need`` says what needs them (default: ``hf-specdec EXTRA``)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; hf_specdec's extras: {', '.join(EXTRAS)}")
    missing = [m for m in modules or EXTRAS[extra] if not installed(m)]
    if missing:
        raise SpecDecError(
            f"{need or 'hf-specdec ' + extra} needs the {extra} extra ({', '.join(missing)} not installed): "
            f"pip install 'hf_specdec[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        )
