"""A drafter's reduced draft vocabulary, sized by measured cost and acceptance: ``hf-specdec draft-vocab``.

On a CPU a drafter's forward is mostly its LM head (``modeling/attached.py``): one layer of SmolLM2-135M is ~3.5M
multiply-adds, its 49,152-row head 28M. Keeping the V most frequent supervised tokens of the training data cuts
the head to V rows; the cost is the target tokens the drafter can no longer propose. For each candidate V this
measures, on held-out ShareGPT:

- ``a(V)``: how often the drafter's top-1 among the V tokens is the target's greedy token (teacher-forced, the
  training mask's delay; the per-draft acceptance rate of greedy chain drafting);
- ``c(V)``: a draft step (the drafter's one-token forward plus the V-row head) in one-token forwards of the target,
  timed on this machine;

and picks the V with the most tokens per unit of time for a chain of ``gamma`` drafts verified in one forward of
``gamma + 1`` tokens costing ``c_v`` (``core.verify_cost``): ``E(a) / (c_v + gamma c(V))`` with
``E(a) = (1 - a^(gamma + 1)) / (1 - a)`` tokens per step. ``--apply`` restricts the checkpoint to the chosen V (its
``draft_vocab_ids``; a drafter trained over the full vocabulary keeps its ranking inside the subset) and records
the table on its card.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hf_specdec.core.drafter_cost import draft_step_costs
from hf_specdec.errors import SpecDecError
from hf_specdec.options import add_model_arguments


def expected_tokens(a: float, gamma: int) -> float:
    """Tokens per verification of a chain of ``gamma`` drafts, each accepted with probability ``a`` (bonus included)."""
    return float(gamma + 1) if a >= 1 else (1 - a ** (gamma + 1)) / (1 - a)


def vocab_table(
    trainer, drafter, counts, always: list[int], sizes: list[int], costs: dict, c_verify: float, gamma: int
):
    """One row per size V (0 = the drafter's whole vocabulary): coverage of the supervised training tokens, ``a(V)``,
    ``c(V)`` and the chain's tokens per unit of time; ``trainer``'s validation set gives ``a``."""
    full = drafter.draft_vocab_ids
    logits, argmax = trainer.validation_logits()
    columns = torch.arange(logits.shape[1]) if full is None else full.cpu()  # column -> token id
    total = max(sum(counts.values()), 1)
    rows = []
    for v in sizes:
        keep = columns if not v else frequent_tokens_from_counts(counts, always, v)
        allowed = torch.isin(columns, keep)
        if not bool(allowed.any()):
            raise SpecDecError(f"a draft vocabulary of {v} shares no token with the drafter's vocabulary")
        top = columns[logits.masked_fill(~allowed, float("-inf")).argmax(-1)]
        a = float((top == argmax).float().mean())
        kept = set(keep.tolist())
        rows.append(
            {
                "size": v or len(columns),
                "coverage": round(sum(c for t, c in counts.items() if t in kept) / total, 4),
                "a": round(a, 4),
                "c": round(costs[v], 4),
                "tokens_per_time": round(expected_tokens(a, gamma) / (c_verify + gamma * costs[v]), 4),
            }
        )
    return rows


def frequent_tokens_from_counts(counts, always: list[int], size: int) -> torch.Tensor:
    """The ``size`` most frequent tokens of ``counts`` (the ``always`` ids first), sorted."""
    ranked = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common())]))[:size]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "draft-vocab", help="size a drafter's draft vocabulary by measured cost and acceptance"
    )
    p.add_argument("--drafter", required=True, help="GLIDE or EDD checkpoint folder")
    add_model_arguments(p, "--model", "the target")
    p.add_argument(
        "--sizes", default="2048,4096,8192,16384,0", help="candidate sizes; 0 = the drafter's whole one"
    )
    p.add_argument("--gamma", type=int, default=5, help="chain length the choice is made for")
    p.add_argument(
        "--train-blocks", type=int, default=2000, help="training blocks the token frequencies come from"
    )
    p.add_argument("--blocks", type=int, default=32, help="validation blocks a(V) is measured on")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--corpus", default=None, help="a token corpus (default: tokenize ShareGPT now)")
    p.add_argument(
        "--apply", action="store_true", help="restrict the checkpoint to the best size and record it"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from hf_specdec.core.verify_cost import timed_cost
    from hf_specdec.options import parse_ints
    from hf_specdec.target import load_target

    from ..data.chat import frequent_tokens
    from ..data.rows import training_blocks
    from .calibration import validation_trainer

    folder = Path(args.drafter)
    if not (folder / "config.json").is_file():
        raise SpecDecError(f"--drafter {folder}: no config.json there; pass a GLIDE or EDD checkpoint folder")
    sizes = parse_ints(args.sizes)
    if not sizes or any(v < 0 for v in sizes):
        raise SpecDecError(f"--sizes {args.sizes!r}: give sizes >= 1, or 0 for the whole vocabulary")
    target, tokenizer = load_target(args.model, "fp32", gguf_file=args.gguf_file)
    drafter = AutoModelForCausalLM.from_pretrained(folder, target=target).eval()
    whole = target.config.vocab_size if drafter.draft_vocab_ids is None else len(drafter.draft_vocab_ids)
    if any(v > whole for v in sizes):
        print(f"sizes above the drafter's {whole}-token vocabulary left out")
        sizes = [v for v in sizes if v <= whole] or [0]
    spec = argparse.Namespace(
        corpus=args.corpus,
        block_size=args.block_size,
        max_steps=args.train_blocks,
        batch_size=1,
        grad_accum=1,
        eval_blocks=args.blocks,
    )
    train, valid = training_blocks(spec, tokenizer)
    always = sorted(set(tokenizer.all_special_ids) | {tokenizer.eos_token_id})
    _, counts = frequent_tokens(train, 1, always)
    costs = draft_step_costs(drafter, target, sizes)
    curve = timed_cost(target, torch.randint(3, 1000, (256,)))
    c_verify = curve(args.gamma + 1)
    with validation_trainer(drafter, target, valid) as trainer:
        rows = vocab_table(trainer, drafter, counts, always, sizes, costs, c_verify, args.gamma)
    best = max(rows, key=lambda r: r["tokens_per_time"])
    print(
        f"gamma {args.gamma}, verifying {args.gamma + 1} tokens costs c_v = {c_verify:.2f} one-token forwards"
    )
    print("| V | coverage | a(V) | c(V) | tokens / time |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        mark = " (best)" if r is best else ""
        print(
            f"| {r['size']}{mark} | {r['coverage']:.3f} | {r['a']:.3f} | {r['c']:.3f} | {r['tokens_per_time']:.3f} |"
        )
    if args.apply:
        if best["size"] != whole:
            drafter.set_draft_vocab(frequent_tokens_from_counts(counts, always, best["size"]))
            drafter.save_pretrained(folder)
        card = folder / "model_card.json"
        if card.is_file():
            info = json.loads(card.read_text())
            info["draft_vocab"] = {
                "gamma": args.gamma,
                "c_verify": round(c_verify, 3),
                "chosen": best["size"],
                "table": rows,
            }
            card.write_text(json.dumps(info, indent=1))
        print(f"{folder}: draft vocabulary {best['size']}")
    return 0
