"""The heads file of PLD+(a) (PLD+, arXiv:2412.01447, §4.2.1): write, read and check it; the named targets' shipped files.

JSON (``FORMAT``): the target's fingerprint (``target.target_fingerprint``), the task and counts it was made from,
and ``heads``: ``[{"layer": l, "head": g, "score": hit_rate}, ...]`` best first. ``layer`` indexes the decoder
layers (0-based, like ``model.model.layers``), ``head`` the query heads of that layer. Finding the heads is
``induction_heads.py`` (``hf-specdec find-heads``); this module is all that decoding needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import SpecDecError

FORMAT = "hf_specdec.induction_heads/1"
RESOURCES = Path(__file__).parent.parent / "resources"
DEFAULT_HEADS_FILE = RESOURCES / "SmolLM2-135M-Instruct.heads.json"
# One per named target (``targets.TARGETS``), made by `hf-specdec find-heads --model NAME`; picked by fingerprint.
SHIPPED_HEADS_SUFFIX = ".heads.json"

_READ_CACHE: dict[tuple, list[tuple[int, int]]] = {}


def write_heads_file(path: str | os.PathLike, model, heads: list[dict], **meta) -> Path:
    """Write a heads file for ``model`` (``heads`` as :func:`rank_heads` returns them)."""
    from ..fingerprint import target_fingerprint

    cfg = model.config.get_text_config()
    doc = {
        "format": FORMAT,
        "target": target_fingerprint(model),
        "num_layers": cfg.num_hidden_layers,
        "num_heads": cfg.num_attention_heads,
        **meta,
        "heads": heads,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_heads_doc(path: str | os.PathLike) -> dict:
    """Parse and check the structure of a heads file (not against a model)."""
    path = Path(path)
    if not path.is_file():
        raise SpecDecError(
            f"heads file {path} does not exist; make one with `hf-specdec find-heads --out {path}`"
        )
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecDecError(
            f"heads file {path} is not valid JSON ({exc}); regenerate it with `hf-specdec find-heads`"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SpecDecError(
            f"{path} is not a heads file (expected format {FORMAT!r}); regenerate it with `hf-specdec find-heads`"
        )
    heads = doc.get("heads")
    if not isinstance(heads, list) or not heads:
        raise SpecDecError(
            f"heads file {path} lists no heads; rerun `hf-specdec find-heads` with more prompts"
        )
    for i, entry in enumerate(heads):
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool) for k in ("layer", "head")
        ):
            raise SpecDecError(
                f"heads file {path}: entry {i} must have integer 'layer' and 'head', got {entry!r}"
            )
    return doc


def read_heads_file(path: str | os.PathLike, model=None, top: int | None = None) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs of a heads file, best first, the ``top`` first ones only.

    With ``model``, checks that the file was made for it (fingerprint) and that every layer / head index exists in
    it; raises :class:`SpecDecError` naming the fix otherwise.
    """
    if top is not None and (not isinstance(top, int) or top < 1):
        raise SpecDecError(f"pld_top_heads must be a positive integer, got {top!r}")
    key = None
    if model is not None:
        emb = model.get_input_embeddings().weight
        key = (str(Path(path).resolve()), id(model), emb.data_ptr(), top)
        if key in _READ_CACHE:
            return _READ_CACHE[key]
    doc = load_heads_doc(path)
    pairs = [(int(e["layer"]), int(e["head"])) for e in doc["heads"]]
    if model is not None:
        from ..fingerprint import check_fingerprint

        check_fingerprint(doc.get("target", {}), model, what=f"heads file {path}")
        cfg = model.config.get_text_config()
        for layer, head in pairs:
            if not 0 <= layer < cfg.num_hidden_layers or not 0 <= head < cfg.num_attention_heads:
                raise SpecDecError(
                    f"heads file {path}: head (layer {layer}, head {head}) does not exist in this model "
                    f"({cfg.num_hidden_layers} layers x {cfg.num_attention_heads} heads); regenerate it for this model"
                )
    pairs = pairs[:top] if top is not None else pairs
    if key is not None:
        _READ_CACHE[key] = pairs
    return pairs


def default_heads_file(model) -> Path:
    """The shipped heads file made for ``model`` (a named target: matched by fingerprint); otherwise an error that
    says what to run."""
    from ..fingerprint import fingerprint_matches, target_fingerprint

    actual = target_fingerprint(model)
    shipped = sorted(RESOURCES.glob(f"*{SHIPPED_HEADS_SUFFIX}")) if RESOURCES.is_dir() else []
    for path in shipped:
        if fingerprint_matches(load_heads_doc(path).get("target", {}), actual):
            return path
    names = ", ".join(p.name[: -len(SHIPPED_HEADS_SUFFIX)] for p in shipped) or "none here"
    raise SpecDecError(
        "PLD+(a) needs the induction heads of this model: run `hf-specdec find-heads --model PATH --out heads.json` "
        f"and pass pld_heads='heads.json' (heads files ship for the named targets only: {names})"
    )
