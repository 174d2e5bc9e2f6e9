"""Train an EDD drafter for a target (EDD, ACL 2025, §3.1, App. B): ``hf-specdec train edd --output-dir DIR``.

Data: ShareGPT conversations in the target's chat template, packed into blocks, assistant tokens supervised
(``trainers/data/chat.py``), with a validation split. Each step the frozen target encodes the batch under no_grad
(its hidden states of layer ``encoder_layer`` are EDD's soft prompt, its next-token distribution the KL target),
EDD runs teacher-forced under the dual-block mask with a block length drawn from [5, 10] (``modeling/masks.py``),
and the loss is ``KL(P_t || P_d)`` (eq. 4; ``trainers/drafters/losses.py``). The run is the one shared with GLIDE
(``trainers/drafters/run.py``, ``DrafterTrainer`` with ``loss="kl"``). Resumable (the last checkpoint, by default),
progress bar, validation (KL, CE, top-1 agreement with the target), loss curve and model card.

Ablations of Table 3: ``--no-soft-prompt`` (w/o encoding result), ``--loss ce`` (w/o KL divergence),
``--block-min 5 --block-max 5`` (w/o random division length).
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

from hf_specdec.errors import SpecDecError

DEFAULT_EDD_DIR = "runs/edd-smollm2"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_job_arguments(p)
    p.add_argument("--block-size", type=int, default=256, help="packed sequence length")
    p.add_argument("--batch-size", type=int, default=4, help="paper: 8")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument(
        "--lr", type=float, default=3e-4, help="AdamW learning rate (paper: 1e-4 for one full epoch)"
    )
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument(
        "--encoder-layer", type=int, default=None, help="target hidden_states index (default: [-4])"
    )
    p.add_argument("--no-soft-prompt", action="store_true", help="ablation: w/o encoding result")
    p.add_argument("--loss", choices=["kl", "ce"], default="kl", help="kl = eq. 4 (paper); ce = ablation")
    add_unrolled_arguments(p)
    p.add_argument("--block-min", type=int, default=5, help="shortest block length L of the dual-block mask")
    p.add_argument("--block-max", type=int, default=10, help="longest block length L (equal to min: fixed L)")
    p.add_argument(
        "--init", choices=["target", "random"], default="target", help="warm start the layer from the target"
    )
    p.add_argument("--draft-vocab", type=int, default=0, help="keep only the N most frequent tokens (0: all)")
    add_run_arguments(p)


def measure(target, tokenizer, drafter, prompts: int, max_new_tokens: int = 64) -> dict:
    """Greedy tau/alpha of the chain (``assistant_model=drafter``) and of PCT on the first mt-bench prompts, and
    whether both outputs equal plain greedy decoding."""
    from hf_specdec.core.stats import DecodeStats, ForwardMeter
    from hf_specdec.core.tree_decoding import tree_generate
    from hf_specdec.edd.tree_proposer import EddTreeProposer
    from hf_specdec.tasks import load_task

    rows = load_task("mt-bench", tokenizer, prompts)
    chain, tree = DecodeStats(), DecodeStats()
    identical = True
    proposer = EddTreeProposer(drafter, "pct")
    for row in rows:
        ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(target.device)
        kw = dict(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
        )
        with torch.no_grad():
            ref = target.generate(**kw)
            with ForwardMeter(target) as meter:
                out = target.generate(**kw, assistant_model=drafter)
            s = meter.chain_stats(ids.shape[1], out.shape[1] - ids.shape[1], 0.0)
            out_tree = target.generate(**kw, custom_generate=tree_generate, proposer=proposer, stats=tree)
        identical &= torch.equal(ref, out) and torch.equal(ref, out_tree)
        chain.new_tokens += s.new_tokens
        chain.target_forwards += s.target_forwards
        chain.drafted += s.drafted
        chain.accepted += s.accepted
    steps = [st for st in tree.steps if st["nodes"]]
    return {
        "prompts": len(rows),
        "max_new_tokens": max_new_tokens,
        "chain_tau": round(chain.tau, 3),
        "chain_alpha": round(chain.alpha or 0.0, 3),
        "pct_tau": round(tree.tau, 3),
        "pct_nodes_per_step": round(sum(st["nodes"] for st in steps) / max(len(steps), 1), 2),
        "pct_s_d/s_t": round(proposer.timer.ratio, 4),
        "identical_to_greedy": bool(identical),
    }


def write_model_card(out_dir: str | Path, info: dict) -> Path:
    out_dir = Path(out_dir)
    intro = [
        f"# EDD drafter for {info['target']['name']}",
        "",
        "An Effective Draft Decoder (EDD, ACL 2025, §3.1) for lossless speculative decoding with `hf_specdec`: one "
        "decoder layer of the target's architecture reading the target's hidden states as a soft prompt. Embedding "
        "and LM head are the target's and are not stored here. Use with",
        "",
        *usage_snippet("edd", out_dir, info["target"].get("name")),
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
        ("validation", "validation (held-out, L = 5)"),
        ("validation_rows", "validation rows"),
        ("calibration", "confidence calibration for PCT (validation, `hf-specdec calibrate`)"),
        ("measured", "measured (greedy, mt-bench)"),
        ("cost", "drafter cost c (one draft forward / one target forward, `core/drafter_cost.py`)"),
        ("command", "command"),
    ]
    footnote = (
        "measured: tau = tokens per target forward (bonus token included), alpha = accepted / drafted tokens; "
        "validation: alpha = mean of sum_x min(P_t(x), P_d(x)), the papers' acceptance rate (speculative sampling); "
        "top1_match = "
        "how often EDD's argmax equals the target's on validation tokens; kl = KL(P_t || P_d) per token; "
        "top1_other_context = the top-1 match with the soft prompt of another validation sequence (the gap is what "
        "the soft prompt is worth)."
    )
    from hf_specdec.trainers.drafters.run import drafter_card_rows
    from hf_specdec.trainers.run_support import write_card

    data = drafter_card_data(info, "edd", intro[0].removeprefix("# "))
    return write_card(out_dir, info, intro, drafter_card_rows(info, fields), [footnote], card_data=data)


def _build(args, target):
    from hf_specdec.modeling import EddConfig, EddForCausalLM

    if not 1 <= args.block_min <= args.block_max:
        raise SpecDecError(f"need 1 <= --block-min <= --block-max (got {args.block_min}, {args.block_max})")
    config = EddConfig.for_target(
        target,
        encoder_layer=args.encoder_layer,
        soft_prompt=not args.no_soft_prompt,
        block_min=args.block_min,
        block_max=args.block_max,
        loss=args.loss,
    )
    drafter = EddForCausalLM(config).to(device=target.device, dtype=target.dtype)
    drafter.attach_target(target)
    if args.init == "target":
        drafter.init_from_target(target)
    return drafter


def _architecture(args, drafter, coverage) -> str:
    config = drafter.config
    return (
        f"1 {config.layer_config['model_type']} decoder layer (hidden {config.hidden_size}), soft prompt = "
        + (f"target hidden_states[{config.encoder_layer}]" if config.soft_prompt else "none (ablation)")
        + f", dual-block mask L ~ U[{config.block_min}, {config.block_max}], loss {config.loss}, {init_words(args)}"
        + (f", draft vocab {vocab}" if (vocab := draft_vocab_words(config, coverage)) else "")
    )


def _calibrate(trainer) -> dict:
    from hf_specdec.trainers.drafters.calibration import calibrate_drafter, describe

    calibration = calibrate_drafter(trainer)  # PCT's confidences (trainers/drafters/calibration.py)
    print(f"calibration: {describe(calibration)}")
    return {"calibration": describe(calibration)}


def run(args) -> int:
    from hf_specdec.trainers.drafters.run import DrafterRecipe, run_drafter_training

    recipe = DrafterRecipe(
        name="EDD",
        build=_build,
        loss=lambda args, drafter: (drafter.config.loss, 0.0),
        architecture=_architecture,
        measure=measure,
        write_card=write_model_card,
        after_training=_calibrate,
    )
    return run_drafter_training(args, recipe)
