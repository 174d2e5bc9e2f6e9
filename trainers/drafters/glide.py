"""Train a GLIDE drafter (or, with --no-cross-attention, the vanilla drafter) for a target (GLIDE, arXiv:2402.02082, §4.1).

Data: ShareGPT conversations in the target's chat template, packed into blocks, assistant tokens supervised
(``trainers/data/chat.py``), with a validation split. The frozen target runs under no_grad on every batch to produce
its KV cache; the drafter reads it through the block-wise cross-attention mask (L = 5). Resumable
(from the last checkpoint, by default), progress bar, loss curve and model card written to ``--output-dir``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from hf_specdec.trainers.drafters.card import draft_vocab_words, drafter_card_data, init_words, usage_snippet
from hf_specdec.trainers.drafters.options import (
    add_job_arguments,
    add_run_arguments,
    add_unrolled_arguments,
)

DEFAULT_GLIDE_DIR = "runs/glide-smollm2"
DEFAULT_VANILLA_DIR = "runs/vanilla-smollm2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_job_arguments(p)
    p.add_argument("--block-size", type=int, default=256, help="packed sequence length")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-4, help="AdamW learning rate (paper: 5e-4)")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=1, help="number of draft layers N_D (paper: 1 for 7B/13B)")
    p.add_argument(
        "--no-cross-attention", action="store_true", help="train the vanilla drafter (Fig. 4 ablation)"
    )
    p.add_argument(
        "--target-layers", default=None, help="comma-separated target layers to read (default: top)"
    )
    p.add_argument("--mask-block", type=int, default=5, help="L of the block-wise cross-attention mask")
    p.add_argument("--draft-vocab", type=int, default=0, help="keep only the N most frequent tokens (0: all)")
    p.add_argument(
        "--loss",
        choices=["ce", "kl"],
        default="ce",
        help="ce: cross entropy on the data (+ --kl-weight x KL); kl: KL(target || drafter) alone",
    )
    p.add_argument(
        "--kl-weight", type=float, default=0.0, help="with --loss ce: weight of KL(target || drafter)"
    )
    add_unrolled_arguments(p)
    p.add_argument(
        "--init", choices=["target", "random"], default="target", help="warm start from target layers"
    )
    add_run_arguments(p)


def measure(target, tokenizer, drafter, prompts: int, max_new_tokens: int = 64) -> dict:
    """alpha / tau of ``target.generate(assistant_model=drafter)`` on the first mt-bench prompts (greedy)."""
    from hf_specdec.core.stats import ForwardMeter
    from hf_specdec.tasks import load_task

    rows = load_task("mt-bench", tokenizer, prompts)
    new = fwd = drafted = accepted = 0
    for row in rows:
        ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(target.device)
        with ForwardMeter(target) as meter, torch.no_grad():
            out = target.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                assistant_model=drafter,
            )
        s = meter.chain_stats(ids.shape[1], out.shape[1] - ids.shape[1], 0.0)
        new, fwd, drafted, accepted = (
            new + s.new_tokens,
            fwd + s.target_forwards,
            drafted + s.drafted,
            accepted + s.accepted,
        )
    return {
        "prompts": len(rows),
        "max_new_tokens": max_new_tokens,
        "tau": round(new / fwd, 3) if fwd else None,
        "alpha": round(accepted / drafted, 3) if drafted else None,
    }


def write_model_card(out_dir: str | Path, info: dict) -> Path:
    """README.md for a saved drafter: target, data, steps, budget, validation metrics, measured alpha/tau."""
    out_dir = Path(out_dir)
    kind = (
        "GLIDE drafter"
        if info.get("cross_attention", True)
        else "vanilla drafter (GLIDE without cross-attention)"
    )
    intro = [
        f"# {kind} for {info['target']['name']}",
        "",
        "A draft model for lossless speculative decoding with `hf_specdec` (GLIDE, arXiv:2402.02082, §4.1). Embedding and LM "
        "head are the target's and are not stored here; load with",
        "",
        *usage_snippet("glide", out_dir, info["target"].get("name")),
    ]
    fields = [
        ("architecture", "architecture"),
        ("data", "data"),
        ("steps", "optimizer steps"),
        ("train_tokens", "training tokens (packed, incl. unsupervised)"),
        ("train_tokens_total", "training tokens with the --init-from drafter's"),
        ("budget", "budget"),
        ("train_tokens_per_hour", "training tokens per hour (evaluations included)"),
        ("machine", "machine"),
        ("validation", "validation (held-out)"),
        ("validation_rows", "validation rows"),
        ("measured", "measured (greedy, `target.generate(assistant_model=...)`)"),
        ("bench", "bench"),
        ("cost", "drafter cost c (one draft forward / one target forward, `core/drafter_cost.py`)"),
        ("command", "command"),
    ]
    footnote = (
        "measured: alpha = accepted / drafted tokens, tau = tokens per target forward (bonus token included); "
        "validation: alpha = mean of sum_x min(P_t(x), P_d(x)), the papers' acceptance rate (speculative sampling); "
        "top1_match = how often the drafter's argmax equals the target's on validation tokens; "
        "top1_other_context = the same with the target's KV cache of another validation sequence (the gap is what "
        "the glimpse is worth)."
    )
    from hf_specdec.trainers.drafters.run import drafter_card_rows
    from hf_specdec.trainers.run_support import write_card

    data = drafter_card_data(info, "glide", intro[0].removeprefix("# "))
    return write_card(out_dir, info, intro, drafter_card_rows(info, fields), [footnote], card_data=data)


def _build(args, target):
    from hf_specdec.modeling import GlideConfig, GlideForCausalLM

    target_layers = [int(x) for x in args.target_layers.split(",")] if args.target_layers else None
    config = GlideConfig.for_target(
        target,
        num_hidden_layers=args.layers,
        cross_attention=not args.no_cross_attention,
        target_layers=target_layers,
        block_size=args.mask_block,
    )
    drafter = GlideForCausalLM(config).to(device=target.device, dtype=target.dtype)
    drafter.attach_target(target)
    if args.init == "target":
        drafter.init_from_target(target)
    return drafter


def _architecture(args, drafter, coverage) -> str:
    config = drafter.config
    return (
        f"{config.num_hidden_layers} layer(s) d_D={config.hidden_size}, "
        + (
            f"cross-attention into target layers {config.target_layers}, "
            if config.cross_attention
            else "no cross-attention, "
        )
        + f"block mask L={config.block_size}, draft vocab {draft_vocab_words(config, coverage) or 'full'}"
        + f", {init_words(args)}"
    )


def run(args) -> int:
    from hf_specdec.trainers.drafters.run import DrafterRecipe, run_drafter_training

    recipe = DrafterRecipe(
        name="GLIDE" if not args.no_cross_attention else "the vanilla drafter",
        build=_build,
        loss=lambda args, drafter: (args.loss, args.kl_weight),
        architecture=_architecture,
        measure=measure,
        write_card=write_model_card,
        extra_info=lambda drafter: {"cross_attention": drafter.config.cross_attention},
    )
    return run_drafter_training(args, recipe)
