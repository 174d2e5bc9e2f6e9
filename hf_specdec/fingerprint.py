"""A target's fingerprint: what a drafter (or a heads file) records about the target it belongs to, and the check on
load (apart from ``target.py`` so that code exported without us, e.g. ``export-custom-generate``, needs no loader)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from transformers import PreTrainedModel

from .errors import SpecDecError


def target_fingerprint(model: PreTrainedModel) -> dict:
    """What a drafter records about the target it belongs to; compared on load (see ``check_fingerprint``)."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.detach().float()
    # The sign pattern of a probe of the embedding tells two trained models apart and survives dtype casts.
    probe = (emb[:: max(1, emb.shape[0] // 64)][:64, :64] > 0).cpu().numpy().tobytes()
    return {
        "name": Path(getattr(cfg, "name_or_path", "") or cfg.model_type).name,
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": cfg.vocab_size,
        "embedding_sha1": hashlib.sha1(probe).hexdigest(),
    }


# What must agree for a recorded fingerprint to name a model (its ``name`` is only a label).
KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "embedding_sha1")


def fingerprint_matches(expected: dict, actual: dict) -> bool:
    """Whether the recorded fingerprint ``expected`` describes the model whose fingerprint is ``actual``."""
    return all(expected.get(k) == actual[k] for k in KEYS)


def check_fingerprint(expected: dict, model: PreTrainedModel, what: str = "this drafter") -> None:
    """Raise a clear error when ``model`` is not the target ``expected`` describes."""
    actual = target_fingerprint(model)
    diffs = [k for k in KEYS if expected.get(k) != actual[k]]
    if diffs:
        detail = ", ".join(f"{k}: drafter has {expected.get(k)!r}, target has {actual[k]!r}" for k in diffs)
        raise SpecDecError(
            f"{what} was built for target {expected.get('name')!r}, not for this one ({detail}); "
            "use the target it was trained for or train a drafter for this target (`hf-specdec train ...`)"
        )
