"""Command-line option helpers shared by every module that defines a sub-command (``add_parser``): the model
arguments and comma-separated number lists. They live here, not in ``hf_specdec.cli``, so that library modules
(``pld_plus/tune.py``, ``edd/tree_replay.py``, ``trainers/``, ``bench/cli.py``) never import the command line."""

from __future__ import annotations

import argparse
import re
import sys

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
    p: argparse.ArgumentParser,
    flag: str = "--model",
    what: str = "the causal LM",
    deprecated: tuple[str, ...] = (),
) -> None:
    """``flag`` (``--model``: a model folder, a Hub id in the local cache, a ``.gguf`` file or a named target) and
    ``--gguf-file NAME`` (the GGUF inside that folder), shared by every command that loads a model; the command
    passes both to ``load_target(args.model, ..., gguf_file=args.gguf_file)``. ``deprecated``: older spellings of
    ``flag`` (``--target``) still accepted into the same ``args`` field, each with a note on stderr."""
    p.add_argument(
        flag,
        *deprecated,
        default=None,
        metavar="PATH_OR_ID",
        action=_deprecated_aliases(deprecated) if deprecated else "store",
        help=f"{what}: a model folder, a Hub id in the local HF cache, or a .gguf file "
        "(default: the embedded SmolLM2-135M-Instruct)"
        + (f"; {', '.join(deprecated)}: its deprecated name" if deprecated else ""),
    )
    p.add_argument(
        "--gguf-file",
        default=None,
        metavar="NAME",
        help=f"the GGUF file inside {flag}'s folder (de-quantized once, cached under $HF_SPECDEC_HOME)",
    )


def _deprecated_aliases(aliases: tuple[str, ...]) -> type[argparse.Action]:
    """A store action that prints a deprecation note when the option is given as one of ``aliases``."""

    class Store(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string in aliases:
                print(
                    f"hf-specdec: {option_string} is deprecated: use {self.option_strings[0]} (same value)",
                    file=sys.stderr,
                )
            setattr(namespace, self.dest, values)

    return Store


# the library's parameters named in its errors -> the command line's flags for them (:func:`cli_message`)
FLAGS = {"model": "--model", "gguf_file": "--gguf-file"}
_PARAMETER = re.compile(r"(?<![\w.-])(model|gguf_file)=(\S?)")


def cli_message(message: str) -> str:
    """A library error as the command line says it: ``model=X`` and ``gguf_file=NAME`` (``load_target``'s
    parameters, which library errors name) become ``--model X`` and ``--gguf-file NAME``."""

    def flag(m: re.Match) -> str:
        rest = m.group(2)
        return FLAGS[m.group(1)] + (f" {rest}" if rest and rest not in ";,:.)" else rest)

    return _PARAMETER.sub(flag, message)
