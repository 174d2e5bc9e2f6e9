"""Train a GLIDE drafter (or, with --no-cross-attention, the vanilla drafter) for a target (glide-cape.txt §4.1).

Data: ShareGPT conversations in the target's chat template, packed into blocks, assistant tokens supervised
(``trainers/data.py``), with a validation split. The frozen target runs under no_grad on every batch to produce
its KV cache; the drafter reads it through the block-wise cross-attention mask (L = 5). Resumable
(``--resume``), progress bar, loss curve and model card written to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
from hf_specdec.trainers.run_options import add_job_arguments, add_run_arguments

from hf_specdec.errors import SpecDecError

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
    p.add_argument("--kl-weight", type=float, default=0.0, help="weight of KL(target || drafter)")
    p.add_argument(
        "--init", choices=["target", "random"], default="target", help="warm start from target layers"
    )
    p.add_argument("--eval-blocks", type=int, default=24, help="validation blocks")
    add_run_arguments(p)


def measure(target, tokenizer, drafter, prompts: int, max_new_tokens: int = 64) -> dict:
    """alpha / tau of ``target.generate(assistant_model=drafter)`` on the first mt-bench prompts (greedy)."""
    from hf_specdec.stats import ForwardMeter
    from hf_specdec.tasks import load_task

    rows = load_task("mt-bench", tokenizer, prompts)
    new = fwd = drafted = accepted = 0
    for row in rows:
        ids = tokenizer(row["prompt"], return_tensors="pt").input_ids
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
        "A draft model for lossless speculative decoding with `hf_specdec` (glide-cape.txt §4.1). Embedding and LM "
        "head are the target's and are not stored here; load with",
        "",
        "```python",
        "import hf_specdec",
        "from hf_specdec.modeling import GlideForCausalLM",
        "target, tok = hf_specdec.load_default_target('fp32')",
        f"drafter = GlideForCausalLM.from_pretrained('{out_dir}', target=target)",
        "target.generate(**inputs, assistant_model=drafter)",
        "```",
    ]
    fields = [
        ("architecture", "architecture"),
        ("data", "data"),
        ("steps", "optimizer steps"),
        ("train_tokens", "training tokens (packed, incl. unsupervised)"),
        ("budget", "budget"),
        ("validation", "validation (held-out ShareGPT)"),
        ("measured", "measured (greedy, `target.generate(assistant_model=...)`)"),
        ("bench", "bench"),
        ("command", "command"),
    ]
    footnote = (
        "measured: alpha = accepted / drafted tokens, tau = tokens per target forward (bonus token included); "
        "validation: alpha = mean of sum_x min(P_t(x), P_d(x)), the papers' acceptance rate (speculative sampling); "
        "top1_match = how often the drafter's argmax equals the target's on validation tokens; "
        "top1_other_context = the same with the target's KV cache of another validation sequence (the gap is what "
        "the glimpse is worth)."
    )
    from hf_specdec.trainers.drafter_trainer import write_drafter_card

    return write_drafter_card(out_dir, info, intro, fields, footnote)


def run(args) -> int:
    from hf_specdec.modeling import GlideConfig, GlideForCausalLM
    from hf_specdec.trainers.data import install_draft_vocab, packed_dataset
    from hf_specdec.trainers.drafter_trainer import DrafterTrainer, TimeLimitCallback, write_training_curve
    from transformers import TrainingArguments, set_seed

    from hf_specdec.target import load_target

    if args.max_steps < 1:
        raise SpecDecError(f"--max-steps must be at least 1 (got {args.max_steps})")
    set_seed(args.seed)
    t_start = time.perf_counter()
    target, tokenizer = load_target(args.target, args.dtype)
    target.requires_grad_(False)
    n_train = args.max_steps * args.batch_size * args.grad_accum
    print(
        f"packing ShareGPT into {n_train} train / {args.eval_blocks} validation blocks of {args.block_size} tokens"
    )
    train = packed_dataset(tokenizer, "train", args.block_size, limit=n_train)
    valid = packed_dataset(tokenizer, "validation", args.block_size, limit=args.eval_blocks)
    target_layers = [int(x) for x in args.target_layers.split(",")] if args.target_layers else None
    config = GlideConfig.for_target(
        target,
        num_hidden_layers=args.layers,
        cross_attention=not args.no_cross_attention,
        target_layers=target_layers,
        block_size=args.mask_block,
    )
    drafter = GlideForCausalLM(config).to(target.dtype)
    drafter.attach_target(target)
    if args.init == "target":
        drafter.init_from_target(target)
    coverage = install_draft_vocab(drafter, train, tokenizer, args.draft_vocab) if args.draft_vocab else None

    targs = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        weight_decay=0.0,
        lr_scheduler_type="cosine",
        warmup_steps=args.warmup_steps,
        logging_steps=args.logging_steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        save_total_limit=2,
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=False,
    )
    trainer = DrafterTrainer(
        model=drafter,
        args=targs,
        train_dataset=train,
        eval_dataset=valid,
        target=target,
        kl_weight=args.kl_weight,
        callbacks=[TimeLimitCallback.from_args(args)],
    )
    resume = None
    if args.resume:
        ckpts = sorted(Path(args.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        if not ckpts:
            raise SpecDecError(
                f"--resume: no checkpoint-* folder in {args.output_dir}; drop --resume to start fresh"
            )
        resume = str(ckpts[-1])
    t_train = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    train_seconds = time.perf_counter() - t_train
    metrics = trainer.evaluate()
    drafter.save_pretrained(args.output_dir)
    write_training_curve(trainer.state.log_history, args.output_dir)

    info = {
        "target": config.target_info,
        "cross_attention": config.cross_attention,
        "architecture": (
            f"{config.num_hidden_layers} layer(s) d_D={config.hidden_size}, "
            + (
                f"cross-attention into target layers {config.target_layers}, "
                if config.cross_attention
                else "no cross-attention, "
            )
            + f"block mask L={config.block_size}, draft vocab "
            + (f"{config.draft_vocab_size} (coverage {coverage:.1%})" if coverage is not None else "full")
            + f", init {args.init}"
        ),
        "data": f"ShareGPT (train split, packed {args.block_size}-token blocks, assistant tokens supervised)",
        "steps": trainer.state.global_step,
        "train_tokens": trainer.state.global_step * args.batch_size * args.grad_accum * args.block_size,
        "budget": f"{train_seconds / 60:.1f} min on {torch.get_num_threads()} CPU threads ({args.dtype}), "
        f"batch {args.batch_size}x{args.grad_accum}, lr {args.lr}, kl {args.kl_weight}",
        "validation": {k.removeprefix("eval_"): round(v, 4) for k, v in metrics.items()},
        "command": "hf-specdec " + shlex.join(sys.argv[1:])
        if sys.argv and "hf-specdec" in sys.argv[0]
        else "",
    }
    if args.measure_prompts:
        info["measured"] = measure(target, tokenizer, drafter, args.measure_prompts)
        print(f"measured on {args.measure_prompts} mt-bench prompts: {info['measured']}")
    write_model_card(args.output_dir, info)
    print(
        f"saved drafter to {args.output_dir} ({trainer.state.global_step} steps, {(time.perf_counter() - t_start) / 60:.1f} min)"
    )
    return 0
