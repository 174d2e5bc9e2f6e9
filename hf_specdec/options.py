"""Command-line option helpers shared by every module that defines a sub-command (``add_parser``): the model
arguments and comma-separated number lists. They live here, not in ``hf_specdec.cli``, so that library modules
(``pld_plus/tune.py``, ``edd/tree_replay.py``, ``trainers/``, ``bench/cli.py``) never import the command line."""

from __future__ import annotations

import argparse

from .errors import SpecDecError

# ``--tie-tol``'s default by dtype name (``core/lossless.py`` explains it); here, without torch, for ``--help``
TIE_TOL_BY_DTYPE: dict[str, float | None] = {"fp32": None, "bf16": 0.25, "fp16": 0.05}


def parse_floats(text: str) -> list[float]:
    """A sub-command's comma-separated list of numbers (``"0.01,0.004"``); a clear error otherwise."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecDecError(f"expected a comma-separated list of numbers, got {text!r}") from None


def parse_ints(text: str) -> list[int]:
    """:func:`parse_floats` for integers (``"5,10"``)."""
    return [int(x) for x in parse_floats(text)]


def add_model_arguments(
    p: argparse.ArgumentParser, flag: str = "--model", what: str = "the causal LM"
) -> None:
    """``flag`` (``--model`` or ``--target``: a model folder, a Hub id in the local cache, or a ``.gguf`` file) and
    ``--gguf-file NAME`` (the GGUF inside that folder), shared by every command that loads a model; the command
    passes both to ``load_target(..., gguf_file=args.gguf_file)``."""
    p.add_argument(
        flag,
        default=None,
        metavar="PATH_OR_ID",
        help=f"{what}: a model folder, a Hub id in the local HF cache, or a .gguf file "
        "(default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--gguf-file",
        default=None,
        metavar="NAME",
        help=f"the GGUF file inside {flag}'s folder (de-quantized once, cached under $HF_SPECDEC_HOME)",
    )
