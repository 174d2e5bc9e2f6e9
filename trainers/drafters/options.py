"""Command-line options shared by the drafter trainers (``hf-specdec train glide`` and ``train edd``).

Kept apart from ``trainer.py`` so that building the CLI parser does not import ``transformers.Trainer``.
Each trainer adds ``add_job_arguments`` first, its own options, then ``add_run_arguments``.
"""

from __future__ import annotations

import argparse

from hf_specdec.options import add_model_arguments


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """Which target, where the output goes, and how long to train."""
    add_model_arguments(p, "--model", "the target", deprecated=("--target",))
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--output-dir", required=True, help="where checkpoints, curve and the final drafter go")
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument(
        "--max-minutes", type=float, default=None, help="stop (and save) after this much wall time"
    )
    p.add_argument(
        "--corpus",
        default=None,
        help="pre-tokenized ShareGPT from `hf-specdec corpus --out DIR` (default: tokenize ShareGPT now)",
    )
    p.add_argument(
        "--mix-corpus",
        action="append",
        default=None,
        metavar="DIR",
        help="also train on this token corpus (repeatable): each corpus, --corpus's included, gives an equal share "
        "of the rows, interleaved row by row (e.g. the target's own answers with ShareGPT's text)",
    )
    p.add_argument(
        "--mix-skip-rows",
        type=int,
        default=0,
        metavar="N",
        help="--mix-corpus: skip each mixed split's first N rows (text a --init-from drafter has already seen)",
    )
    p.add_argument(
        "--features",
        default=None,
        help="train from a feature store (`hf-specdec features --out DIR`): no target forward per step",
    )
    p.add_argument(
        "--teacher-top-k",
        type=int,
        default=None,
        help="KL against the target's top-k tokens only, as a feature store keeps them (default: all)",
    )
    p.add_argument(
        "--train-context",
        choices=["packed", "conversation"],
        default="packed",
        help="training rows: packed blocks of --block-size tokens (default), or each conversation from its start as "
        "when decoding (--train-length tokens at most, batches of as many tokens as --batch-size blocks hold)",
    )
    p.add_argument(
        "--train-length",
        type=int,
        default=1024,
        help="--train-context conversation: the tokens of each conversation trained on, from its start",
    )
    add_precision_argument(p)
    p.add_argument(
        "--init-from",
        default=None,
        metavar="DIR",
        help="start from a saved drafter's weights (and draft vocabulary) instead of --init: continued training",
    )
    p.add_argument(
        "--skip-train-rows",
        type=int,
        default=0,
        metavar="N",
        help="train on the rows after the split's first N (continued training on text the --init-from drafter has "
        "not seen: its card's steps x batch)",
    )


def add_precision_argument(p: argparse.ArgumentParser) -> None:
    """``--precision`` (and its short form ``--bf16``) of every training run."""
    p.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="the training step's precision: bf16 = mixed precision (bf16 autocast over fp32 weights and optimizer "
        "state); auto (default) = bf16 where the device computes it natively (a GPU, or a CPU with AVX512-BF16 or "
        "AMX), fp32 elsewhere",
    )
    p.add_argument("--bf16", dest="precision", action="store_const", const="bf16", help="--precision bf16")


def add_resume_argument(p: argparse.ArgumentParser) -> None:
    """``--resume`` / ``--no-resume`` of every training run; the policy is ``run_support.resume_point``'s."""
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="by default a run continues from the last checkpoint-N in --output-dir if there is one; --resume "
        "requires one, --no-resume starts fresh and refuses a folder that holds checkpoints",
    )


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Evaluation, checkpointing, logging, the model card's measurement, stopping early, resuming, seed."""
    p.add_argument(
        "--eval-tokens",
        type=int,
        default=20000,
        help="validate on held-out blocks holding at least this many supervised tokens (enough to read a top-1 "
        "to two digits)",
    )
    p.add_argument(
        "--eval-blocks",
        type=int,
        default=None,
        help="validation blocks, or conversations with --eval-context conversation (instead of --eval-tokens)",
    )
    p.add_argument(
        "--eval-corpus",
        default=None,
        metavar="DIR",
        help="validate on this corpus's validation split (`hf-specdec corpus`, e.g. a regenerated one) instead of "
        "--corpus's or ShareGPT's: the same held-out text for runs trained on different data",
    )
    p.add_argument(
        "--eval-context",
        choices=["conversation", "packed"],
        default="conversation",
        help="validation rows: each held-out conversation from its start, as when decoding (default), or packed "
        "blocks like the training data's, which start mid-conversation",
    )
    p.add_argument(
        "--eval-length",
        type=int,
        default=1024,
        help="--eval-context conversation: the tokens of each conversation validated, from its start",
    )
    p.add_argument("--eval-steps", type=int, default=50)
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=None,
        help="validation rows per batch and process (default: --batch-size blocks, or the conversations that hold as "
        "many tokens)",
    )
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument("--measure-prompts", type=int, default=3, help="mt-bench prompts for the card's alpha/tau")
    p.add_argument(
        "--card-cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the drafter's cost c in fp32 and bf16 for its card (about half a minute on a 2-core CPU)",
    )
    p.add_argument(
        "--stop-at-step",
        type=int,
        default=None,
        help="stop (and save) at this step, keeping the lr schedule of --max-steps (equal-budget ablations)",
    )
    add_resume_argument(p)
    p.add_argument(
        "--eval-only",
        action="store_true",
        help="no training: validate the --init-from drafter on the validation rows (--eval-corpus, --eval-tokens, "
        "...) and write the figures to --output-dir/eval_results.json",
    )
    p.add_argument(
        "--add-to-card",
        action="store_true",
        help="--eval-only: also record the figures in the --init-from drafter's model card (model_card.json and "
        "README.md), beside its training-time validation",
    )
    p.add_argument("--seed", type=int, default=0)


def add_unrolled_arguments(p: argparse.ArgumentParser) -> None:
    """Train as you draft (``trainers/drafters/unrolled.py``), GLIDE and EDD alike."""
    from .unrolled import DEFAULT_DECAY

    p.add_argument(
        "--ttt-steps",
        type=int,
        default=1,
        help="train as you draft: unroll K steps, each feeding the drafter its own greedy drafts of the step before "
        "inside every drafting round (EAGLE-3's training-time test); 1 = teacher forcing (default)",
    )
    p.add_argument(
        "--ttt-decay",
        type=float,
        default=DEFAULT_DECAY,
        help=f"weight of unrolled step k is decay**(k-1), normalised to sum 1 (default {DEFAULT_DECAY})",
    )


def unrolled_options(args) -> dict:
    """``DrafterTrainer``'s ``ttt_steps`` / ``ttt_decay`` from ``--ttt-steps`` / ``--ttt-decay``, checked (a
    ``SpecDecError`` naming the option for 0, a negative or a non-finite value)."""
    from .unrolled import DEFAULT_DECAY, step_weights

    options = {
        "ttt_steps": getattr(args, "ttt_steps", 1),
        "ttt_decay": getattr(args, "ttt_decay", DEFAULT_DECAY),
    }
    step_weights(options["ttt_steps"], options["ttt_decay"])
    return options
