"""``hf-specdec``: the command line. Each sub-command lives in its own module that provides
``add_parser(subparsers)`` (which sets ``func``); add new ones to ``COMMANDS``, and the extra it needs beyond the
core requirements (``hf_specdec/extras.py``) to ``COMMAND_EXTRAS``."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from ..errors import SpecDecError
from ..extras import require_extra
from ..options import cli_message

COMMANDS = [
    "hf_specdec.bench.cli",
    "hf_specdec.cli.demo",
    "hf_specdec.cli.train",
    "hf_specdec.cli.export_custom_generate",
    "hf_specdec.pld_plus.induction_heads",
    "hf_specdec.pld_plus.tune",
    "hf_specdec.edd.tree_replay",
    "hf_specdec.trainers.drafters.calibration",
    "hf_specdec.trainers.corpus.command",
    "hf_specdec.trainers.drafters.features",
    "hf_specdec.trainers.drafters.draft_vocab",
]
# command -> the extra it needs, checked before it runs: a missing package is one error naming the pip line at once,
# not an ImportError after the model has loaded (or hours into training). Building the parser needs none of them.
COMMAND_EXTRAS = {
    "bench": "bench",
    "demo": "bench",
    "train": "train",
    "calibrate": "train",
    "corpus": "train",
    "features": "train",
    "draft-vocab": "train",
}


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
        if args.command in COMMAND_EXTRAS:
            require_extra(COMMAND_EXTRAS[args.command], need=f"hf-specdec {args.command}")
        return args.func(args) or 0
    except SpecDecError as exc:
        print(f"hf-specdec: error: {cli_message(str(exc))}", file=sys.stderr)  # flags, not parameters
        return 2
    except KeyboardInterrupt:
        print("hf-specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
