"""The checkpoints shipped in the package (``hf_specdec/resources``), found for a target by the fingerprint they record.

A named target (``targets.py``) may ship a drafter of each kind, ``resources/{kind}-{short name}/`` (``glide``,
``vanilla``, ``edd``: the target in ``config.json``'s ``target_info``), a SPACE adapter (``space-{short name}/``:
``space_training.json``'s ``target_info``) and PLD+(a)'s heads file (``{name}.heads.json``: its ``target``). A method
given no checkpoint takes the one made for its target (:func:`shipped_checkpoint`), never another target's: a GLIDE
drafter of SmolLM2 on Gemma would fail its fingerprint check anyway, with a message about the wrong thing.
``glide_cape`` and ``edd_pct`` given no ``drafter=`` load the target's shipped drafter once (:func:`shipped_drafter`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import SpecDecError
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


# kind -> (the drafter class in hf_specdec.modeling, its name in messages, the custom_generate function that takes it)
DRAFTERS = {
    "glide": ("GlideForCausalLM", "GLIDE", "glide_cape"),
    "edd": ("EddForCausalLM", "EDD", "edd_pct"),
}
_LOADED = "_hf_specdec_shipped_drafters"  # the drafters loaded for a model, kept on it


def shipped_drafter(kind: str, model):
    """The ``kind`` drafter (``glide``, ``edd``) shipped for the target ``model``, for a method given no
    ``drafter=``: loaded once in ``model``'s dtype and on its device, then kept on ``model`` (a plain attribute, not a
    submodule), so later calls reuse it. None ships for ``model``: one :class:`SpecDecError` naming ``drafter=``,
    the command that trains one and the targets that ship one."""
    cls_name, name, method = DRAFTERS[kind]
    key = (kind, str(model.dtype), str(model.device))
    loaded = model.__dict__.setdefault(_LOADED, {})
    if key in loaded:
        return loaded[key]
    path = shipped_checkpoint(kind, model)
    if path is None:
        raise SpecDecError(
            f"{method} needs {'an' if name[0] in 'AEIOU' else 'a'} {name} drafter: no drafter= was given and none "
            f"ships for this target (one ships for: {', '.join(shipped_targets(kind)) or 'none'}). Train one with "
            f"`hf-specdec train {kind} --model MODEL --output-dir DIR` and pass it as drafter=: "
            f"target.generate(..., custom_generate=hf_specdec.{method}, "
            f"drafter={cls_name}.from_pretrained(DIR, target=target))"
        )
    # through the Auto classes (``import hf_specdec`` registers the drafters): this module imports no drafter module
    from transformers import AutoModelForCausalLM

    drafter = AutoModelForCausalLM.from_pretrained(path, target=model, dtype=model.dtype)
    loaded[key] = drafter.to(model.device).eval()
    return loaded[key]
