"""Clear errors for checkpoints that do not load: which weight file is truncated or corrupt, and what to do (kept
apart from ``errors.py`` so that code exported without us, e.g. ``export-custom-generate``, imports no safetensors)."""

from __future__ import annotations

from .errors import SpecDecError


def unreadable_files(folder) -> dict[str, str]:
    """The ``*.safetensors`` files in ``folder`` whose header safetensors cannot read (truncated or corrupt), each
    with safetensors' reason."""
    from pathlib import Path

    from safetensors import SafetensorError, safe_open

    bad = {}
    for path in sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            bad[str(path)] = str(exc).strip() or type(exc).__name__
    return bad


def checkpoint_error(path, exc: Exception, what: str, fix: str) -> SpecDecError:
    """The one-line error for a checkpoint at ``path`` that failed to load with ``exc``: names the unreadable
    weight file(s) when there are some (with safetensors' reason), and ``fix`` (re-download, re-train ...).
    ``what`` names the checkpoint ("GLIDE drafter"), or the parameter that gave it (``"model="``)."""
    bad = unreadable_files(path)
    what = what if what.endswith("=") else f"{what} "
    if bad:
        files = "; ".join(f"{file} is truncated or corrupt ({reason})" for file, reason in bad.items())
        return SpecDecError(f"{what}{path}: {files}; {fix}")
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return SpecDecError(f"{what}{path}: cannot be loaded ({reason}); {fix}")
