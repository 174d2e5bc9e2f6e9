"""The one training entry shared by ``hf-specdec train glide`` and ``train edd``: what differs is a ``DrafterRecipe``.

Steps: load the frozen target, build the training / validation rows (``data/rows.py``: packed blocks or whole
conversations, from ``--corpus``, a pre-tokenized corpus, or by tokenizing ShareGPT now), build
``TrainingArguments``, put the target on ``TrainingArguments.device`` (the Trainer moves only the drafter), build the
drafter there (the recipe), train with ``DrafterTrainer`` (resuming from the last checkpoint in ``--output-dir``:
``run_support.resume_point``), evaluate, run the recipe's post-training step (EDD: confidence calibration), save the
drafter, its training curve and model card. ``--eval-only`` stops after building the ``Trainer``: it validates the
``--init-from`` drafter and writes ``eval_results.json``.

Several processes (``torchrun --nproc_per_node N`` or ``accelerate launch --num_processes N``, gloo on a CPU, NCCL
on GPUs): each runs this on its device, the Trainer shards the batches and syncs gradients (``DrafterTrainer``
normalises the loss by the global token count, so N processes equal one with the same global batch), validation
metrics are summed over processes, and the main process alone writes the drafter, curve and card.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_specdec.core.drafter_cost import costs_by_dtype
from hf_specdec.errors import SpecDecError
from hf_specdec.machine import describe_machine, machine_line

from ..data.rows import (
    describe_rows,
    eval_batch_size,
    mixed_corpora,
    rows_per_batch,
    skipped_rows,
    train_tokens,
    training_blocks,
    validation_rows,
    validation_source,
    whole_conversations,
)
from .eval_only import eval_only_checked, write_eval_results


@dataclass
class DrafterRecipe:
    """What one drafter's training does differently.

    - ``build(args, target) -> drafter``: the drafter for ``target`` (on the target's device, not yet attached);
    - ``loss(args, drafter) -> (kind, kl_weight)``: ``DrafterTrainer``'s loss (``"ce"`` plus ``kl_weight`` x KL,
      or ``"kl"``, eq. 4 of EDD (ACL 2025));
    - ``architecture(args, drafter, coverage) -> str``: the card's architecture line;
    - ``after_training(trainer) -> dict``: extra card entries after the final evaluation (may be empty);
    - ``measure(target, tokenizer, drafter, prompts) -> dict``: the card's quick greedy measurement;
    - ``write_card(out_dir, info)``: the model card (``run_support.write_card`` with the recipe's text,
      :func:`drafter_card_rows` for the table);
    - ``extra_info(drafter) -> dict``: other card entries.
    """

    name: str
    build: Callable
    loss: Callable
    architecture: Callable
    measure: Callable
    write_card: Callable
    after_training: Callable = lambda trainer: {}
    extra_info: Callable = lambda drafter: {}


def training_arguments(args):
    """``TrainingArguments`` of a drafter run (cosine schedule, evaluation and checkpoints every N steps)."""
    from transformers import TrainingArguments

    from ..run_support import shared_training_arguments

    shared = shared_training_arguments(args)
    # whole-conversation rows of like lengths batch together, so little of a batch is padding
    if whole_conversations(args, "train"):
        shared.update(
            per_device_train_batch_size=rows_per_batch(args, "train"),
            train_sampling_strategy="group_by_length",
        )
    return TrainingArguments(
        **shared,
        per_device_eval_batch_size=args.eval_batch_size or eval_batch_size(args),
        learning_rate=args.lr,
        weight_decay=0.0,
        warmup_steps=args.warmup_steps,
        disable_tqdm=False,
        use_cache=True,  # the Trainer sets the drafter's config.use_cache to this, and the saved config keeps it
    )


def run_drafter_training(args, recipe: DrafterRecipe) -> int:
    """Train, evaluate and save one drafter as ``recipe`` says (module docstring)."""
    from transformers import set_seed

    from hf_specdec.target import load_target

    from ..data.chat import install_draft_vocab
    from ..data.tokenized import corpus_source
    from ..run_support import TimeLimitCallback, per_hour, resume_point, timed_train
    from .options import unrolled_options
    from .trainer import DrafterTrainer, write_training_curve

    if args.max_steps < 1:
        raise SpecDecError(f"--max-steps must be at least 1 (got {args.max_steps})")
    unrolled = unrolled_options(args)  # checked before the target loads
    whole_conversations(args)  # likewise --eval-length
    whole_conversations(args, "train")  # and --train-length (not with --features)
    skipped_rows(args)  # and --skip-train-rows
    mixed_corpora(args)  # and --mix-corpus / --mix-skip-rows
    eval_only = eval_only_checked(args)
    resume = None if eval_only else resume_point(args.output_dir, args.resume)  # before the target loads
    set_seed(args.seed)
    t_start = time.perf_counter()
    target, tokenizer = load_target(args.model, args.dtype, gguf_file=args.gguf_file)
    target.requires_grad_(False)
    targs = training_arguments(args)
    store = None
    if (
        args.features
    ):  # the training blocks and what the drafter reads come from the store; validation stays live
        from .features import FeatureStore

        store = FeatureStore(args.features)
        args.block_size = store.meta["block_size"]
    train, valid = training_blocks(
        args, tokenizer, targs.world_size, with_train=store is None and not eval_only
    )
    target.to(targs.device)  # the Trainer places the drafter; the frozen target is ours to place
    drafter = recipe.build(args, target)
    if getattr(args, "init_from", None):
        warm_start(drafter, args.init_from, target)
    if store is not None:
        store.check(drafter, target)
        train = store
    coverage = install_draft_vocab(drafter, train, tokenizer, args.draft_vocab) if args.draft_vocab else None
    kind, kl_weight = recipe.loss(args, drafter)
    trainer = DrafterTrainer(
        model=drafter,
        args=targs,
        train_dataset=train,
        eval_dataset=valid,
        target=target,
        loss=kind,
        kl_weight=kl_weight,
        teacher_top_k=args.teacher_top_k or (store.meta["top_k"] if store is not None else None),
        callbacks=[TimeLimitCallback.from_args(args)],
        **unrolled,
    )
    if eval_only:
        return write_eval_results(args, trainer)
    _, train_seconds, steps_run = timed_train(trainer, resume)
    metrics = final_validation(trainer)
    extra = recipe.after_training(trainer)  # on every process (EDD's calibration gathers from all)
    if not trainer.is_world_process_zero():  # one process writes the drafter, its curve and its card
        return 0
    drafter.save_pretrained(args.output_dir)
    write_training_curve(trainer.state.log_history, args.output_dir)
    where = (
        torch.cuda.get_device_name(targs.device)
        if targs.device.type == "cuda"
        else f"{torch.get_num_threads()} CPU threads"
    )
    steps = trainer.state.global_step
    tokens = train_tokens(args, None if store else train, steps, targs.world_size)
    info = {
        "target": getattr(drafter.config, drafter.fingerprint_field),
        **recipe.extra_info(drafter),
        "architecture": recipe.architecture(args, drafter, coverage),
        "data": (
            f"{corpus_source(args.corpus) if args.corpus else 'ShareGPT'} (train split, {describe_rows(args, 'train')}, "
            "assistant tokens supervised"
            + (f", corpus {Path(args.corpus).name}" if args.corpus else "")
            + (f", feature store of {len(store)} blocks, teacher top-{store.meta['top_k']}" if store else "")
            + ")"
        ),
        "steps": steps,
        "train_tokens": tokens,
        **warm_start_tokens(args, tokens),
        # this process's steps over its wall time, its evaluations included (a resumed run: the steps since the resume)
        "train_tokens_per_hour": round(
            per_hour(train_tokens(args, None if store else train, steps_run, targs.world_size), train_seconds)
        ),
        "machine": machine_line(describe_machine(targs.device)),
        "budget": f"{train_seconds / 60:.1f} min on {where} ({args.dtype}{', bf16 mixed precision' if targs.bf16 else ''}), "
        f"batch {args.batch_size}x{args.grad_accum}"
        + (f"x{targs.world_size} processes" if targs.world_size > 1 else "")
        + f", lr {args.lr}, loss {kind}"
        + (f" + {kl_weight} x kl" if kind == "ce" and kl_weight else "")
        + (
            f", train as you draft {unrolled['ttt_steps']} steps (weights {unrolled['ttt_decay']:g}^k)"
            if unrolled["ttt_steps"] > 1
            else ""
        )
        + (f", warm start {args.init_from}" if getattr(args, "init_from", None) else ""),
        "validation": {k.removeprefix("eval_"): round(v, 4) for k, v in metrics.items()},
        "validation_rows": validation_rows(args),
        "validation_source": validation_source(args),
        **extra,
        "command": getattr(args, "command_line", ""),  # set by the CLI, whichever way it was started
    }
    if getattr(args, "card_cost", True):
        info["cost"] = costs_by_dtype(drafter, target)  # c in fp32 and bf16 on this machine
    if args.measure_prompts:
        info["measured"] = recipe.measure(target, tokenizer, drafter, args.measure_prompts)
        print(f"measured on {args.measure_prompts} mt-bench prompts: {info['measured']}")
    recipe.write_card(args.output_dir, info)
    print(
        f"saved {recipe.name} to {args.output_dir} ({steps} steps, {(time.perf_counter() - t_start) / 60:.1f} min)"
    )
    return 0


def final_validation(trainer) -> dict:
    """The validation figures of the trained drafter: the ``Trainer``'s own evaluation at the last step when it made
    one (it evaluates at ``max_steps``; a whole-conversation validation pass costs minutes on a CPU), else a new one
    (a run stopped early by ``--max-minutes`` or ``--stop-at-step``)."""
    step = trainer.state.global_step
    for logged in reversed(trainer.state.log_history):
        if "eval_loss" in logged and logged.get("step") == step:
            return {k: v for k, v in logged.items() if k != "step"}
    return trainer.evaluate()


def warm_start_tokens(args, tokens: int) -> dict:
    """``{"train_tokens_total": ...}``: this run's tokens plus those its ``--init-from`` drafter's card records; empty
    without a warm start or a card that says."""
    card = Path(args.init_from) / "model_card.json" if getattr(args, "init_from", None) else None
    if card is None or not card.is_file():
        return {}
    info = json.loads(card.read_text())
    before = info.get("train_tokens_total", info.get("train_tokens"))
    return {"train_tokens_total": before + tokens} if isinstance(before, int) else {}


def warm_start(drafter, path: str, target) -> None:
    """Load a saved drafter's weights (and its reduced draft vocabulary, if any) into ``drafter`` (``--init-from``):
    continued training under this run's recipe. Its own config must have the same shapes."""
    saved = type(drafter).from_pretrained(path, target=target)
    if saved.draft_vocab_ids is not None:
        drafter.set_draft_vocab(saved.draft_vocab_ids)
    state = saved.state_dict()
    mine = drafter.state_dict()
    if set(state) != set(mine) or any(state[k].shape != mine[k].shape for k in mine):
        raise SpecDecError(
            f"--init-from {path}: its weights do not fit this run's {type(drafter).__name__} (other layers or sizes)"
        )
    drafter.load_state_dict(state)
    print(f"warm start from {path}")


def drafter_card_rows(info: dict, fields: list[tuple[str, str]]) -> list[tuple[str, object]]:
    """A drafter card's table: the target's fingerprint, then the ``(key, label)`` ``fields`` present in ``info``."""
    t = info["target"]
    target = (
        f"{t['name']} ({t['model_type']}, hidden {t['hidden_size']}, {t['num_hidden_layers']} layers, "
        f"vocab {t['vocab_size']}, embedding sha1 {t['embedding_sha1'][:12]})"
    )
    return [("target", target), *((label, info[key]) for key, label in fields if key in info)]
