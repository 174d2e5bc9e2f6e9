"""SAR-SFT of a causal LM for SPACE auto-correct decoding (SPACE, arXiv:2402.11809, §3.1, §4.1, App. A.1).

``hf-specdec train space --k 5 --p-ar 0.5``: adds the mask token ``[M]`` (special token + one embedding row,
normal init as in §4.1), fine-tunes on ShareGPT (or ``--corpus``) with ``SpaceDataCollator`` through a plain
``transformers.Trainer`` (LoRA via ``peft`` by default, with the new embedding row trainable through
``trainable_token_indices``; ``--full`` for full fine-tuning) and saves a ``save_pretrained`` model
(merged, or the adapter) with a model card that records k, p_ar and the measured tau.
The same command with ``--p-ar 1`` trains the plain-SFT baseline of §4.2.2 (same data, same recipe).

The saved config carries ``space_mask_token_id`` and ``space_k`` so ``hf_specdec.space`` finds them.

Several processes (``torchrun --nproc_per_node N`` or ``accelerate launch --num_processes N``): the masks are drawn
per sample before training (:func:`drawn_training_set`), so N processes with batch b train on exactly the data of
one process with batch N x b (and a resumed run on the same data as an uninterrupted one); the ``Trainer`` places
the model on each process's device, shards the batches, syncs gradients and gathers the evaluation loss; the main
process alone writes the final model, its loss history and card.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.fingerprint import target_fingerprint
from hf_specdec.machine import describe_machine, machine_line
from hf_specdec.options import add_model_arguments
from hf_specdec.space.mask_token import add_mask_token
from hf_specdec.target import DEFAULT_TARGET_HUB_ID, DEFAULT_TARGET_NAME

from ..drafters.options import add_precision_argument, add_resume_argument
from .card import measure_tau, write_model_card
from .collator import SpaceDataCollator
from .eval import mask_top1

logger = logging.getLogger(__name__)


def apply_lora(model, mask_token_id: int, r: int = 16, alpha: int = 32, dropout: float = 0.05):
    """Wrap ``model`` with LoRA adapters on every linear layer but the output head (peft's ``"all-linear"``: the
    attention and MLP projections of any architecture, fused ones such as Phi-3's ``qkv_proj`` included); the
    ``[M]`` embedding row is trained too (peft ``trainable_token_indices``, tied to the output head when weights are
    tied)."""
    from peft import LoraConfig, get_peft_model

    emb_name = next(n for n, m in model.named_modules() if m is model.get_input_embeddings()).rsplit(".", 1)[
        -1
    ]
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear",
        trainable_token_indices={emb_name: [mask_token_id]},
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p, "--model", "the base model")
    p.add_argument("--output-dir", required=True, help="checkpoints go here; the final model in OUTPUT/final")
    p.add_argument("--k", type=int, default=5, help="number of mask tokens (paper default 5)")
    p.add_argument(
        "--p-ar", type=float, default=0.5, help="probability a sample stays AR; 1 = plain SFT baseline"
    )
    p.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument(
        "--lora-dropout", type=float, default=0.05, help="0: runs with the same data give the same weights"
    )
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=None, help="default 3e-4 with LoRA, 5e-5 (paper) full")
    p.add_argument("--max-length", type=int, default=320, help="tokens per SFT sample")
    p.add_argument(
        "--corpus",
        default=None,
        help="a token corpus (`hf-specdec corpus`, --regenerate too); default: ShareGPT",
    )
    p.add_argument(
        "--eval-corpus", default=None, help="validation samples from this corpus (default: --corpus)"
    )
    p.add_argument("--train-samples", type=int, default=None, help="SFT samples (default steps*batch)")
    p.add_argument("--eval-samples", type=int, default=64)
    p.add_argument("--eval-steps", type=int, default=100)
    p.add_argument("--save-steps", type=int, default=100)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this wall time")
    p.add_argument("--save", choices=["merged", "adapter"], default="merged")
    p.add_argument(
        "--dtype", default="fp32", choices=["fp32", "bf16"], help="the model's weights (fp32: a master copy)"
    )
    add_precision_argument(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tau-prompts", type=int, default=4, help="validation prompts to measure tau on (0: skip)"
    )
    add_resume_argument(p)
    p.add_argument(
        "--decode-masks",
        type=int,
        default=1,
        help="masks per step the saved model decodes with (1..k; docs/space.md)",
    )


def training_line(args, targs, steps: int, seconds: float) -> str:
    """The card's training row: wall time, samples per hour over this process's ``steps`` (a resumed run: the steps
    since the resume; evaluations included), the precision and the machine."""
    from hf_specdec.trainers.run_support import per_hour

    samples = per_hour(steps * args.batch_size * args.grad_accum * targs.world_size, seconds)
    precision = "bf16 mixed precision" if targs.bf16 else "fp32"
    return (
        f"{seconds / 60:.1f} min, {samples:.0f} samples (<= {args.max_length} tokens) per hour, {precision} "
        f"({args.dtype} weights), {machine_line(describe_machine(targs.device))}"
    )


def drawn_training_set(train, collator: SpaceDataCollator, n: int):
    """``train`` with its SAR masks drawn now (``SpaceDataCollator.fix``), repeated with a fresh draw per repetition
    until it holds at least the ``n`` samples the run consumes; the collator then passes them through unchanged.
    Drawing per sample, not per batch, makes the data independent of how batches are split over processes."""
    from datasets import Dataset

    rows = []
    for repetition in range(-(-n // len(train))):
        seed = collator.seed if repetition == 0 else collator.seed + 1000 + repetition
        rows += replace(collator, seed=seed).fix(train)
    return Dataset.from_list(rows)


def training_arguments(args: argparse.Namespace, lr: float):
    """``TrainingArguments`` of a SAR-SFT run (App. A.1, Table 4: cosine schedule, AdamW 0.9 / 0.999)."""
    from transformers import TrainingArguments

    from ..run_support import shared_training_arguments

    shared = shared_training_arguments(args)
    if args.dtype == "bf16":  # bf16 weights: the step is bf16 whatever --precision says
        shared["bf16"] = True
    return TrainingArguments(
        **shared,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=lr,
        warmup_steps=max(1, args.max_steps // 20),
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
    )


def run(args: argparse.Namespace) -> None:
    from datasets import Dataset
    from hf_specdec.trainers.data.rows import part_corpus
    from hf_specdec.trainers.data.tokenized import first_turns, first_turns_source
    from hf_specdec.trainers.run_support import TimeLimitCallback, resume_point, timed_train
    from transformers import Trainer

    from hf_specdec.target import load_target

    if not 0.0 <= args.p_ar <= 1.0:
        raise SpecDecError(f"--p-ar must be in [0, 1] (got {args.p_ar})")
    if args.k < 1 or not 1 <= args.decode_masks <= args.k:
        raise SpecDecError(
            f"--k must be at least 1 and --decode-masks from 1 to k (got {args.k}, {args.decode_masks})"
        )
    out = Path(args.output_dir)
    resume = resume_point(out, args.resume)  # before the model loads
    torch.manual_seed(args.seed)
    model, tokenizer = load_target(args.model, args.dtype, gguf_file=args.gguf_file)
    base = getattr(model.config, "name_or_path", None) or str(args.model)
    # the base's fingerprint, taken before [M] is added: checked when the adapter loads
    target_info = target_fingerprint(model)
    targs = training_arguments(args, args.lr if args.lr is not None else (5e-5 if args.full else 3e-4))
    # the samples the run consumes: each process takes a batch per micro-step
    eval_corpus = part_corpus(args, "eval")  # --eval-corpus, else --corpus: the drafters' rule
    n_draws = args.max_steps * args.batch_size * args.grad_accum * targs.world_size
    t0 = time.perf_counter()  # with the base's tokenizer, which a --corpus was made with: before [M] is added
    train = first_turns(tokenizer, "train", args.max_length, args.train_samples or n_draws, args.corpus)
    val = held_out = first_turns(tokenizer, "validation", args.max_length, args.eval_samples, eval_corpus)
    logger.warning(
        "data: %d train / %d validation samples (%.0fs)", len(train), len(val), time.perf_counter() - t0
    )
    mask_id = add_mask_token(model, tokenizer, args.k, seed=args.seed)
    model.config.use_cache = False
    if not args.full:
        model = apply_lora(model, mask_id, args.lora_r, args.lora_alpha, args.lora_dropout)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.warning("trainable parameters: %d (%s)", trainable, "full" if args.full else "LoRA + [M] row")
    collator = SpaceDataCollator(mask_id, tokenizer.pad_token_id, k=args.k, p_ar=args.p_ar, seed=args.seed)
    train = drawn_training_set(train, collator, n_draws)
    # Validation masks are drawn once, so successive evaluations (and resumed runs) score the same inputs.
    val = Dataset.from_list(replace(collator, seed=args.seed + 1).fix(val))
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=val, data_collator=collator)
    if args.max_minutes:
        trainer.add_callback(TimeLimitCallback(args.max_minutes * 60))
    result, train_seconds, steps_run = timed_train(trainer, resume)
    metrics = trainer.evaluate()  # on every process: the Trainer gathers the loss over all of them
    if not trainer.is_world_process_zero():  # one process writes the model, its history and its card
        return
    history = [h for h in trainer.state.log_history if "loss" in h]
    (out / "loss_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))

    final = out / "final"
    trained = trainer.model
    trained.eval()  # the masks alone, teacher-forced on the held-out first turns: what a decoding step's draft needs
    mask_scores, spans = mask_top1(trained, held_out, args.k, mask_id)
    # LoRA: the adapter alone is kept too (``OUTPUT/adapter``; ``final`` itself with ``--save adapter``), the form the
    # package ships and ``hf_specdec.load_space_model`` loads
    # (without the resized embedding matrices peft would add: the [M] row is in the adapter, the rest is the base's)
    adapter_dir = None if args.full else (final if args.save == "adapter" else out / "adapter")
    if adapter_dir is not None:
        # the default target's Hub id, so the adapter's config names a base others can load
        if target_info["name"] == DEFAULT_TARGET_NAME:
            trained.peft_config[trained.active_adapter].base_model_name_or_path = DEFAULT_TARGET_HUB_ID
        trained.save_pretrained(adapter_dir, safe_serialization=True, save_embedding_layers=False)
    if not args.full and args.save == "merged":
        trained = trained.merge_and_unload()
    trained.config.use_cache = True
    # a merged model's decoding default (an adapter's is its card's decode_masks)
    trained.config.space_num_masks = args.decode_masks
    if adapter_dir != final:
        trained.save_pretrained(final, safe_serialization=True)
    tokenizer.save_pretrained(final)

    info = {
        "base": base,
        "k": args.k,
        "p_ar": args.p_ar,
        "mask_token_id": mask_id,
        "method": "full fine-tuning" if args.full else f"LoRA r={args.lora_r} + trainable [M] row",
        "steps": trainer.state.global_step,
        "batch": args.batch_size * args.grad_accum * targs.world_size,
        "processes": targs.world_size,
        "training": training_line(args, targs, steps_run, train_seconds),
        "train_loss": round(history[-1]["loss"], 4) if history else round(result.training_loss, 4),
        "eval_loss": round(metrics.get("eval_loss", math.nan), 4),
        "mask_top1": {"ar": mask_scores[0], "masks": mask_scores[1:], "spans": spans},
        "target_info": target_info,
        "command": getattr(args, "command_line", None),
        "data": first_turns_source(args.corpus, eval_corpus),
        "decode_masks": args.decode_masks,
        "decode_masks_detail": f"Decodes with {args.decode_masks} of its {args.k} masks per step by default "
        "(`--decode-masks`; `num_masks=` or the bench's `--option space_masks=N` overrides it): on CPUs the later "
        "masks are rarely accepted and one mask measured fastest (docs/space.md).",
    }
    if args.tau_prompts > 0 and not (not args.full and args.save == "adapter"):
        try:
            trained.eval()
            info["tau"], info["tau_detail"] = measure_tau(trained, tokenizer, args.tau_prompts)
        except Exception as exc:  # the checkpoint is saved; a failed measurement must not lose it
            logger.warning("tau measurement failed: %s", exc)
    write_model_card(final, info, adapter=adapter_dir == final)
    if adapter_dir is not None and adapter_dir != final:
        write_model_card(adapter_dir, info, adapter=True)
    print(f"saved {final} (eval loss {info['eval_loss']}, tau {info.get('tau')})")
