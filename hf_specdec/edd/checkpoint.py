"""Where an EDD checkpoint is looked for when none is named: ``runs/edd-smollm2`` (what ``hf-specdec train edd``
writes in docs/edd-pct.md), else the one shipped in ``hf_specdec/resources/edd-smollm2``. Shared by the bench
(``bench/edd_methods.py``, ``--option edd=PATH``) and ``hf-specdec tree-replay`` (``--drafter PATH``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecDecError

PACKAGED = Path(__file__).resolve().parent.parent / "resources" / "edd-smollm2"
DEFAULTS = [Path("runs/edd-smollm2"), PACKAGED]


def find_edd_checkpoint(option: str | None) -> Path:
    """The EDD folder: ``option`` if given, else the first of :data:`DEFAULTS` that holds a ``config.json``."""
    candidates = [Path(option)] if option else DEFAULTS
    for path in candidates:
        if (path / "config.json").is_file():
            return path
    raise SpecDecError(
        f"no EDD checkpoint at {', '.join(map(str, candidates))}: train one with "
        f"`hf-specdec train edd --output-dir {DEFAULTS[0]}` or pass --option edd=PATH"
    )
