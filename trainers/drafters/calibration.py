"""Calibrating a drafter's confidences for PCT (EDD, ACL 2025, §3.2): ``hf-specdec calibrate --drafter DIR``.

PCT estimates a node's acceptance probability as the product of the drafter's confidences on its path,
``p_j = prod c_i``, because the paper finds the confidences *calibrated*: a token drafted with confidence ``c``
is accepted with probability about ``c`` (Fig. 3b, ECE 0.019). A drafter trained for a short budget need not be;
the shipped EDD is under-confident (tokens drafted with confidence 0.3-0.5 are the target's token half the time).
Temperature scaling (Guo et al., 2017, the calibration reference the paper cites) restores the premise with one
number: confidences ``softmax(logits / T)``, with ``T`` minimising the negative log-likelihood of the target's
greedy token over held-out data, teacher-forced under the training mask (the same delay as inference). ``T``
changes no ranking of one node's children (the chain and VCT are the same), only what reads the confidence values:
PCT's expand and removal decisions and EAGLE-2's re-ranking of paths. ``hf-specdec train edd`` fits it after
training; it is stored as ``config.confidence_temperature`` (1.0 = the raw softmax).

The fit's quality is reported as the top-1 expected calibration error (ECE, equal-width confidence bins) before
and after.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError
from hf_specdec.options import add_model_arguments

ECE_BINS = 10


def temperature_nll(logits: torch.Tensor, gold: torch.Tensor, temperature: float) -> float:
    """Mean ``-log softmax(logits / T)[gold]`` over rows (``logits`` ``(N, V)``, ``gold`` ``(N,)`` column ids)."""
    logp = (logits.float() / temperature).log_softmax(-1)
    return float(-logp.gather(1, gold[:, None]).mean())


def fit_temperature(logits: torch.Tensor, gold: torch.Tensor, low: float = 0.25, high: float = 4.0) -> float:
    """``T`` in ``[low, high]`` minimising :func:`temperature_nll`.

    The NLL is convex in ``1 / T`` (a log-sum-exp of linear functions of it minus a linear one), so a ternary
    search over ``1 / T`` finds the minimum."""
    if logits.shape[0] == 0 or logits.shape[0] != gold.shape[0]:
        raise SpecDecError(
            f"calibration needs matching, non-empty rows (got {logits.shape[0]}, {gold.shape[0]})"
        )
    a, b = 1.0 / high, 1.0 / low
    for _ in range(60):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if temperature_nll(logits, gold, 1.0 / m1) <= temperature_nll(logits, gold, 1.0 / m2):
            b = m2
        else:
            a = m1
    return 1.0 / ((a + b) / 2)


def top1_ece(probs: torch.Tensor, gold: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the top-1 confidence: ``sum_b |B_b|/N * |mean conf - accuracy|`` over
    ``bins`` equal-width confidence bins (Guo et al., 2017)."""
    conf, top = probs.float().max(-1)
    hit = (top == gold).float()
    index = (conf * bins).long().clamp(max=bins - 1)
    ece = 0.0
    for b in range(bins):
        m = index == b
        if m.any():
            ece += float(m.float().mean()) * abs(float(conf[m].mean()) - float(hit[m].mean()))
    return ece


def calibrate(logits: torch.Tensor, gold: torch.Tensor) -> dict:
    """Fit ``T`` on teacher-forced draft logits ``(N, V_draft)`` and the target's greedy tokens as draft columns
    ``(N,)`` (the drafter's ``to_draft_ids``).

    Rows whose target token lies outside a reduced draft vocabulary (negative column) are left out: the drafter
    cannot propose it at any temperature. Returns the temperature and the NLL / ECE before and after."""
    keep = gold >= 0
    logits, gold = logits[keep], gold[keep]
    t = fit_temperature(logits, gold)
    return {
        "temperature": round(t, 4),
        "tokens": int(keep.sum()),
        "nll": [round(temperature_nll(logits, gold, 1.0), 4), round(temperature_nll(logits, gold, t), 4)],
        "top1_ece": [
            round(top1_ece(logits.float().softmax(-1), gold), 4),
            round(top1_ece((logits.float() / t).softmax(-1), gold), 4),
        ],
    }


def calibrate_drafter(trainer) -> dict:
    """:func:`calibrate` on a ``DrafterTrainer``'s validation data; sets ``config.confidence_temperature``."""
    drafter = trainer.accelerator.unwrap_model(trainer.model)
    logits, target_argmax = trainer.validation_logits()
    result = calibrate(logits, drafter.to_draft_ids(target_argmax))
    drafter.config.confidence_temperature = result["temperature"]
    return result


def describe(result: dict) -> str:
    """One line for a model card / the console."""
    return (
        f"confidence temperature {result['temperature']:g} (top-1 ECE {result['top1_ece'][0]:.3f} -> "
        f"{result['top1_ece'][1]:.3f}, NLL of the target's token {result['nll'][0]:.3f} -> {result['nll'][1]:.3f}, "
        f"{result['tokens']} validation tokens)"
    )


CARD_SECTION = "## Confidence calibration (PCT)"


def record_calibration(folder: Path, result: dict) -> None:
    """Write ``confidence_temperature`` into the checkpoint's ``config.json`` (nothing else in it changes) and
    the fit into its model card: ``model_card.json``'s ``calibration`` and a section of ``README.md`` (replaced
    if present; the rest of the card is kept)."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["confidence_temperature"] = result["temperature"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    card = folder / "model_card.json"
    if card.is_file():
        info = json.loads(card.read_text())
        info["calibration"] = describe(result)
        card.write_text(json.dumps(info, indent=1))
    readme = folder / "README.md"
    if readme.is_file():
        text = readme.read_text()
        if CARD_SECTION in text:  # replace the old section, up to the next one
            head, _, rest = text.partition(CARD_SECTION)
            after = rest.find("\n## ")
            text = head.rstrip("\n") + ("" if after < 0 else "\n" + rest[after:])
        section = (
            f"{CARD_SECTION}\n\n{describe(result)}: PCT's confidences are softmax(logits / T) "
            "(`hf-specdec calibrate`, trainers/drafters/calibration.py).\n"
        )
        readme.write_text(text.rstrip("\n") + "\n\n" + section)


# ------------------------------------------------------------------------------------------------ command
def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit an EDD drafter's confidence temperature for PCT on held-out ShareGPT (rewrites its config)",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument("--drafter", required=True, help="EDD checkpoint folder (its config.json is updated)")
    add_model_arguments(p, "--model", "the target")
    p.add_argument("--blocks", type=int, default=48, help="validation blocks")
    p.add_argument("--block-size", type=int, default=128, help="tokens per validation block")
    p.set_defaults(func=run)


@contextmanager
def validation_trainer(drafter, target, valid):
    """A ``DrafterTrainer`` over ``valid`` for validation passes only (calibration, draft-vocab), with a scratch
    output folder that is removed afterwards."""
    from transformers import TrainingArguments

    from .trainer import DrafterTrainer

    with tempfile.TemporaryDirectory() as scratch:
        targs = TrainingArguments(
            output_dir=scratch,
            per_device_eval_batch_size=4,
            report_to=[],
            remove_unused_columns=False,
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,
        )
        yield DrafterTrainer(model=drafter, args=targs, eval_dataset=valid, target=target)


def run(args: argparse.Namespace) -> int:
    from hf_specdec.modeling import EddConfig, EddForCausalLM
    from hf_specdec.trainers.data.chat import packed_dataset

    from hf_specdec.target import load_target

    folder = Path(args.drafter)
    if not (folder / "config.json").is_file():
        raise SpecDecError(f"--drafter {folder}: no config.json there; pass an EDD checkpoint folder")
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type not in (EddConfig.model_type, "edd"):  # "edd": checkpoints written before the namespace
        raise SpecDecError(
            f"--drafter {folder} holds a {model_type!r} model; calibrate fits EDD drafters "
            f"(model_type {EddConfig.model_type!r})"
        )
    if args.blocks < 1 or args.block_size < 8:
        raise SpecDecError(f"need --blocks >= 1 and --block-size >= 8 (got {args.blocks}, {args.block_size})")
    target, tokenizer = load_target(args.model, "fp32", gguf_file=args.gguf_file)
    drafter = EddForCausalLM.from_pretrained(folder, target=target).eval()
    valid = packed_dataset(tokenizer, "validation", args.block_size, limit=args.blocks)
    with validation_trainer(drafter, target, valid) as trainer:
        result = calibrate_drafter(trainer)
    record_calibration(folder, result)
    print(f"{folder}: {describe(result)}")
    return 0
