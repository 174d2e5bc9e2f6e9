"""``hf-specdec``: the command line. Each sub-command lives in its own module that provides
``add_parser(subparsers)`` (which sets ``func``); add new ones to ``COMMANDS``."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from ..errors import SpecDecError

COMMANDS = [
    "hf_specdec.bench.cli",
    "hf_specdec.cli.demo",
    "hf_specdec.cli.train",
    "hf_specdec.cli.export_custom_generate",
    "hf_specdec.pld_plus.induction_heads",
    "hf_specdec.pld_plus.tune",
    "hf_specdec.edd.tree_replay",
    "hf_specdec.trainers.calibration",
    "hf_specdec.trainers.corpus_command",
    "hf_specdec.trainers.features",
    "hf_specdec.trainers.draft_vocab",
]


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-specdec",
        description="Lossless speculative decoding for Hugging Face transformers (GLIDE+CAPE, EDD+PCT, SPACE, PLD+).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub at run time: fail fast instead of hanging
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.command_line = "hf-specdec " + shlex.join(argv)
    try:
        return args.func(args) or 0
    except SpecDecError as exc:
        print(f"hf-specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hf-specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
