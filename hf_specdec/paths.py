"""hf_specdec's cache folder, apart from ``target.py`` so that modules an export bundles (``cost_store.py``) need
no model loader."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Cache folder for converted checkpoints and other derived artifacts (``$HF_SPECDEC_HOME``, default
    ``$XDG_CACHE_HOME/hf_specdec`` or ``~/.cache/hf_specdec``)."""
    root = os.environ.get("HF_SPECDEC_HOME")
    if root:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hf_specdec"
