"""The checkpoints shipped in the package (``hf_specdec/resources``), found for a target by the fingerprint they record.

A named target (``targets.py``) may ship a drafter of each kind, ``resources/{kind}-{short name}/`` (``glide``,
``vanilla``, ``edd``: the target in ``config.json``'s ``target_info``), a SPACE adapter (``space-{short name}/``:
``space_training.json``'s ``target_info``) and PLD+(a)'s heads file (``{name}.heads.json``: its ``target``). A method
given no checkpoint takes the one made for its target (:func:`shipped_checkpoint`), never another target's: a GLIDE
drafter of SmolLM2 on Gemma would fail its fingerprint check anyway, with a message about the wrong thing.
"""

from __future__ import annotations

import json
from pathlib import Path

from .fingerprint import fingerprint_matches, target_fingerprint

RESOURCES = Path(__file__).resolve().parent / "resources"
# kind -> (the file in its folder that records the target, the field holding the fingerprint)
RECORDS = {
    "glide": ("config.json", "target_info"),
    "vanilla": ("config.json", "target_info"),
    "edd": ("config.json", "target_info"),
    "space": ("space_training.json", "target_info"),
}


def recorded_target(kind: str, folder: str | Path) -> dict | None:
    """The target fingerprint a ``kind`` checkpoint folder records (None: no such file or field)."""
    name, key = RECORDS[kind]
    path = Path(folder) / name
    if not path.is_file():
        return None
    recorded = json.loads(path.read_text()).get(key)
    return recorded if isinstance(recorded, dict) else None


def made_for(kind: str, folder: str | Path, model, actual: dict | None = None) -> bool:
    """Whether the ``kind`` checkpoint in ``folder`` was made for ``model`` (``actual``: its fingerprint, if known)."""
    recorded = recorded_target(kind, folder)
    return recorded is not None and fingerprint_matches(recorded, actual or target_fingerprint(model))


def shipped_checkpoint(kind: str, model) -> Path | None:
    """The shipped ``kind`` checkpoint (``glide``, ``vanilla``, ``edd``, ``space``) made for ``model``, else None."""
    actual = target_fingerprint(model)
    for folder in sorted(RESOURCES.glob(f"{kind}-*")):
        if folder.is_dir() and made_for(kind, folder, model, actual):
            return folder
    return None


def shipped_targets(kind: str) -> list[str]:
    """The names of the targets a ``kind`` checkpoint ships for (for error messages)."""
    names = []
    for folder in sorted(RESOURCES.glob(f"{kind}-*")):
        recorded = recorded_target(kind, folder) if folder.is_dir() else None
        if recorded is not None:
            names.append(str(recorded.get("name")))
    return names
