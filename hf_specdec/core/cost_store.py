"""Measured costs kept on disk, so that a later process starts from what an earlier one learnt.

The draft-sizing rule needs the verification cost curve ``c(q)`` (``verify_cost.py``, learnt from the decoding's
own forwards) and a drafter's cost ``c_d`` (``draft_budget.measured_drafter_cost``, timed by ``hf-specdec bench``).
Each is stored in a JSON file, keyed by what it depends on: the model (its class, config and a probe of its weights,
:func:`model_id`), the setting (dtype, device, threads, kernels, batch), the CPU model (or GPU name) and the torch
version. A later process on the same machine starts from it instead of from the priors.

The file is ``$HF_SPECDEC_HOME/costs.json`` (default ``~/.cache/hf_specdec``). ``HF_SPECDEC_COST_STORE`` names
another file, and ``HF_SPECDEC_COST_STORE=off`` turns the store off, so every process starts from the priors. It holds
plain numbers only. A file that cannot be read or parsed counts as empty, and is rewritten on the next store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from ..hf_compat import attn_implementation
from ..kernels import packed_shapes
from ..machine import describe_machine
from ..paths import home

OFF = "off"
logger = logging.getLogger(__name__)


def store_path() -> Path | None:
    """The store's file, or ``None`` when ``HF_SPECDEC_COST_STORE=off``."""
    name = os.environ.get("HF_SPECDEC_COST_STORE")
    if name == OFF:
        return None
    if name:
        return Path(name)
    return home() / "costs.json"


# the way the costs are measured: a change to it (sizes, samples, what a drafter step times) changes this
PROTOCOL = "2"


def model_id(model: torch.nn.Module) -> str:
    """A short hash of what tells ``model`` apart from another as far as its speed goes: its class, its config,
    its attention implementation, the layers ``apply_kernels`` packed (a drafter's head included), and the signs
    of the first values of its first parameters (two checkpoints of one architecture differ there)."""
    h = hashlib.sha1(type(model).__name__.encode())
    config = getattr(model, "config", None)
    if config is not None:
        h.update(config.to_json_string(use_diff=False).encode())
        h.update(str(attn_implementation(model)).encode())
    h.update(packed_shapes(model).encode())
    h.update(type(model.__dict__.get("_head")).__name__.encode())
    for _, p in sorted(model.named_parameters())[:8]:
        h.update((p.detach().flatten()[:64].float() > 0).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _machine(device: torch.device) -> str:
    info = describe_machine(device)
    return f"{info.get('gpu') or info['cpu']}, torch {info['torch']}"


def entry_key(kind: str, models: list[torch.nn.Module], setting: tuple) -> str:
    """The store's key of one measurement: ``kind`` (``"verify"``, ``"drafter"``), the models it timed, their
    ``setting`` and the machine."""
    device = next(models[0].parameters()).device
    parts = [kind, *(model_id(m) for m in models), ", ".join(map(str, setting)), _machine(device)]
    return " | ".join([*parts, f"protocol {PROTOCOL}"])


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(key: str):
    """The stored value of ``key``, or ``None``."""
    path = store_path()
    return None if path is None else _read(path).get(key)


def store(key: str, value) -> None:
    """Keep ``value`` (JSON: numbers, or a mapping of them) under ``key``; an unwritable store is skipped, with a warning."""
    path = store_path()
    if path is None:
        return
    data = _read(path)
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as err:
        logger.warning(
            "hf_specdec: cannot write the cost store %s (%s); costs are measured again next time", path, err
        )
