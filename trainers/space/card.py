"""A SAR-SFT run's model card (``README.md`` + ``space_training.json``) and the greedy tau it records
(``hf-specdec train space``, :mod:`hf_specdec.trainers.space.train`)."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_specdec.space.mask_token import MASK_TOKEN
from hf_specdec.target import DEFAULT_TARGET_HUB_ID, DEFAULT_TARGET_NAME


def write_model_card(folder: Path, info: dict, adapter: bool = False) -> Path:
    """The card of a SAR-SFT / SFT checkpoint (``adapter``: of its LoRA adapter alone): ``README.md`` and
    ``space_training.json`` (the same facts, machine-readable), written by the trainers' one card writer
    (``run_support.write_card``)."""
    from hf_specdec.trainers.run_support import write_card
    from huggingface_hub import ModelCardData

    kind = "SFT baseline (p_ar = 1)" if info["p_ar"] >= 1 else "SAR-SFT model for SPACE"
    processes = f" ({info['processes']} processes)" if info.get("processes", 1) > 1 else ""
    tau = info.get("tau")
    on_default = (info.get("target_info") or {}).get("name") == DEFAULT_TARGET_NAME
    base = DEFAULT_TARGET_HUB_ID if on_default else info["base"]
    intro = [
        f"# {kind}",
        "",
        f"Fine-tuned from `{base}` with `hf-specdec train space` (SPACE, arXiv:2402.11809, §3.1).",
    ]
    rows = [
        ("k (mask tokens)", info["k"]),
        ("p_ar", info["p_ar"]),
        ("mask token", f"`{MASK_TOKEN}` (id {info['mask_token_id']})"),
        ("method", info["method"]),
        ("steps x batch", f"{info['steps']} x {info['batch']}" + processes),
        *([("data", info["data"])] if info.get("data") else []),
        # cards written before the training speed was recorded have no such row
        *([("training", info["training"])] if info.get("training") else []),
        ("final train loss", info.get("train_loss", "-")),
        ("eval loss", info.get("eval_loss", "-")),
        *(
            [("held-out top-1: next token / masks 1..k", _mask_line(info["mask_top1"]))]
            if info.get("mask_top1")
            else []
        ),
        ("measured tau (SPACE greedy)", "-" if tau is None else f"{tau:.3f}"),
    ]
    if info.get("decode_masks") is not None:
        rows.append(("masks per step when decoding (default)", info["decode_masks"]))
    footer = [
        "tau = tokens produced per model forward with auto-correct decoding "
        f"({info.get('tau_detail', 'not measured')}).",
        "",
        "Use: `model.generate(**inputs, custom_generate=hf_specdec.space, max_new_tokens=...)`"
        + (
            " on `model, tok = hf_specdec.load_space_model(adapter=FOLDER)` (this LoRA adapter merged into its base)."
            if adapter
            else "."
        ),
    ]
    if info.get("command"):
        footer += ["", f"Made by: `{info['command']}`"]
    if (info.get("mask_top1") or {}).get("command"):
        footer += ["", f"Held-out top-1 by: `{info['mask_top1']['command']}`"]
    if info.get("decode_masks_detail"):
        footer += ["", info["decode_masks_detail"]]
    # how the run went, where the command alone does not say (an interrupted, resumed run)
    if info.get("note"):
        footer += ["", info["note"]]
    data = ModelCardData(
        # a merged model is a plain causal LM (the Hub's transformers snippet loads it as is); an adapter is peft's
        library_name="peft" if adapter else "transformers",
        base_model=DEFAULT_TARGET_HUB_ID if on_default else None,
        pipeline_tag="text-generation",
        tags=["hf_specdec", "space", "speculative-decoding"],
    )
    return write_card(
        folder,
        info,
        intro,
        rows,
        footer,
        header="| setting | value |",
        json_name="space_training.json",
        card_data=data,
    )


def _mask_line(scores: dict) -> str:
    """``mask_top1``'s figures as a card cell (``eval.py``: teacher-forced, held-out first turns)."""
    masks = " / ".join(f"{x:.3f}" for x in scores["masks"])
    # figures added later (``space/eval.py --add-to-card``) name their held-out text; a run's own are of its data
    of = f" of {scores['samples']} first turns, {scores['data']}" if scores.get("data") else ""
    return f"{scores['ar']:.3f} / {masks} ({scores['spans']} mask spans{of})"


def measure_tau(model, tokenizer, n_prompts: int = 4, max_new_tokens: int = 64) -> tuple[float, str]:
    """Greedy SPACE tau on the first ``n_prompts`` mt-bench prompts (tokens per forward), all ``k`` masks every step
    (``space_cost=False``, the paper's decoding: what the masks accept, not what this machine's cost gate lets them
    draft)."""
    from hf_specdec.core.stats import DecodeStats
    from hf_specdec.space.decoding import space_generate
    from hf_specdec.tasks import load_task

    ds = load_task("mt-bench", tokenizer, n_prompts)
    tokens = forwards = 0
    for row in ds:
        ids = tokenizer(row["prompt"], return_tensors="pt").input_ids.to(model.device)
        stats = DecodeStats()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            custom_generate=space_generate,
            num_masks=model.config.space_k,
            space_cost=False,
            stats=stats,
        )
        tokens += stats.new_tokens
        forwards += stats.target_forwards
    detail = f"{len(ds)} mt-bench prompts, {max_new_tokens} new tokens, greedy, all {model.config.space_k} masks per step"
    return tokens / max(forwards, 1), detail
