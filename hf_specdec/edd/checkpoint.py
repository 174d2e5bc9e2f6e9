"""Where an EDD checkpoint is looked for when none is named: ``runs/edd-smollm2`` (what ``hf-specdec train edd``
writes in docs/edd-pct.md) when made for the target, else the one shipped for the target (``hf_specdec/shipped.py``:
``resources/edd-*``). Shared by the bench (``bench/edd_methods.py``, ``--option edd=PATH``) and ``hf-specdec
tree-replay`` (``--drafter PATH``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecDecError
from ..shipped import made_for, shipped_checkpoint, shipped_targets

TRAINED = Path("runs/edd-smollm2")


def find_edd_checkpoint(option: str | None, model) -> Path:
    """The EDD folder for the target ``model``: ``option`` if given, else :data:`TRAINED` when made for ``model``,
    else the one shipped for ``model``."""
    if option:
        if not (Path(option) / "config.json").is_file():
            raise SpecDecError(f"no EDD checkpoint at {option} (no config.json)")
        return Path(option)
    if (TRAINED / "config.json").is_file() and made_for("edd", TRAINED, model):
        return TRAINED
    shipped = shipped_checkpoint("edd", model)
    if shipped is not None:
        return shipped
    raise SpecDecError(
        f"no EDD drafter for this target (one ships for: {', '.join(shipped_targets('edd')) or 'none'}): train one "
        "with `hf-specdec train edd --model MODEL --output-dir DIR` and pass --option edd=DIR"
    )
