"""A SAR-SFT model as a small ``peft`` LoRA adapter (SPACE, arXiv:2402.11809, §3.1), loaded onto its base model and merged.

The package ships one for the default target (``resources/space-smollm2``, trained by ``hf-specdec train space``;
the command is on its card), so ``custom_generate=hf_specdec.space``, ``hf-specdec demo --method space`` and
``hf-specdec bench --methods ar,space`` run without training first. ``hf-specdec train space`` writes the same form
(``OUTPUT/adapter``) beside the merged model. An adapter folder holds ``adapter_config.json`` and
``adapter_model.safetensors`` (peft's files: JSON and safetensors, no code) and ``space_training.json`` (k, the mask
token id and the fingerprint of the base it was trained on, checked on load).

Loading an adapter merges it with peft, the one package SPACE needs beyond the core requirements: the ``space``
extra (``pip install 'hf_specdec[space]'``; ``train`` and ``bench`` hold it too), checked first with one clear
error. Decoding (``custom_generate=hf_specdec.space``) a merged SAR-SFT model folder, as ``train space`` writes
beside the adapter, needs no peft.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import SpecDecError
from ..extras import require_extra
from ..fingerprint import check_fingerprint
from ..target import load_target
from .mask_token import add_mask_token

SHIPPED_ADAPTER = Path(__file__).resolve().parent.parent / "resources" / "space-smollm2"
CARD_JSON = "space_training.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", CARD_JSON)


def missing_adapter_files(folder: Path) -> list[str]:
    """The files of a SAR-SFT adapter (peft's adapter files and SPACE's card) that ``folder`` lacks."""
    return [name for name in ADAPTER_FILES if not (folder / name).is_file()]


def is_space_adapter(path) -> bool:
    """Whether ``path`` is a folder holding a SAR-SFT adapter."""
    folder = Path(path)
    return folder.is_dir() and not missing_adapter_files(folder)


def load_space_model(dtype="auto", adapter=None, base=None):
    """``(model, tokenizer)`` in ``dtype`` (``"auto"``: bf16 only where the CPU runs it natively, as
    ``load_default_target``): ``base`` (default: the embedded default target) with the ``[M]`` token added as in
    training and the SAR-SFT LoRA ``adapter`` (default: the shipped one) merged into it. The result is a plain causal
    LM whose config carries ``space_mask_token_id`` / ``space_k`` (and ``space_num_masks``, the masks per step to
    decode with, where the card measured one): decode it with ``custom_generate=hf_specdec.space``,
    and its plain greedy ``generate`` is the reference SPACE reproduces. Needs peft: the ``space`` extra."""
    folder = Path(adapter) if adapter is not None else SHIPPED_ADAPTER
    missing = missing_adapter_files(folder)
    if missing:
        raise SpecDecError(
            f"{folder} is not a SPACE adapter (missing {', '.join(missing)}); pass a folder written by "
            "`hf-specdec train space` (OUTPUT/adapter), or a merged SAR-SFT model folder as --model"
        )
    require_extra("space", need=f"loading the SPACE adapter {folder}")  # before the base model loads
    info = json.loads((folder / CARD_JSON).read_text())
    model, tokenizer = load_target(base, dtype)
    if info.get("target_info"):
        check_fingerprint(info["target_info"], model, f"the SPACE adapter {folder}")
    mask_id = add_mask_token(model, tokenizer, int(info["k"]))
    if mask_id != int(info["mask_token_id"]):
        raise SpecDecError(
            f"the SPACE adapter {folder} was trained with the mask token at id {info['mask_token_id']}, but this "
            f"base's tokenizer puts it at {mask_id}; load it onto the base it was trained on"
        )
    from peft import PeftModel

    model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    model.config.use_cache = True
    if info.get("decode_masks") is not None:  # the masks per step that measured fastest (the card says how)
        n = info["decode_masks"]
        if type(n) is not int or not 1 <= n <= int(info["k"]):  # JSON true is a bool, not a mask count
            raise SpecDecError(
                f"the SPACE adapter {folder} has decode_masks={n!r} in {CARD_JSON}; it must be a whole number "
                f"from 1 to its trained k = {info['k']} (or absent: decode with all k masks)"
            )
        model.config.space_num_masks = n
    model.eval()
    return model, tokenizer


def load_model(model=None, dtype="fp32", gguf_file=None, base=None):
    """``--model`` as the bench and demo load it: a SAR-SFT adapter folder through :func:`load_space_model` (onto
    ``base``, default the default target), anything else through ``load_target``."""
    if model is not None and gguf_file is None and is_space_adapter(model):
        return load_space_model(dtype, adapter=model, base=base)
    return load_target(model, dtype, gguf_file=gguf_file)
