"""Mask top-1 of a SAR-SFT model: the validation figure that predicts SPACE's acceptance (SPACE, arXiv:2402.11809, §3.1 eq. 3).

The validation loss of ``train space`` mixes eq. 3's AR terms with its ``k`` mask terms, and the AR terms are
almost all of them (a SAR sample scores its whole answer prefix and ``k`` masks), so it says little about the
masks. This scores the masks alone, teacher-forced on held-out first turns: at mask starts ``m`` every ``stride``
answer tokens, the SAR view of eq. 2 (``collator.sar_sample``) is fed and the argmax at the last real token
(position ``m - 1``: the next token, as AR) and at mask ``i`` (position ``m + i - 1``: the token ``i + 1`` places on)
are compared with the answer. Mask 1's top-1 is what the first draft of a decoding step needs (on the model's own
greedy text: the regenerated corpus's, where the model is the target it was tuned from).

``python -m hf_specdec.trainers.space.eval --model DIR [--corpus DIR] [--add-to-card]`` scores a saved model (a
``train space`` ``final`` folder, or a LoRA ``adapter`` folder merged onto its base); ``--add-to-card`` writes the
figures into the folder's card (``space_training.json`` and ``README.md``), as the drafters' ``--eval-only
--add-to-card`` does.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from hf_specdec.errors import SpecDecError

from .collator import IGNORE_INDEX, mask_starts


def _spans(labels: list[int], k: int, stride: int) -> list[int]:
    """Every ``stride``-th mask start whose span and the token after it (mask k's label) are answer tokens."""
    n = len(labels)
    return [m for m in mask_starts(labels, k)[::stride] if m + k < n and labels[m + k] != IGNORE_INDEX]


def span_inputs(length: int, starts: list[int], k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed, positions)`` of one forward that holds a row's ``length`` real tokens, then one group of ``k``
    masks per start ``m``: the real tokens causal; mask ``i`` of group ``m`` at position ``m + i`` (0-based), seeing
    the real tokens before ``m`` and its group's earlier masks, so each group is the SAR view of eq. 2 at ``m``."""
    n = length + k * len(starts)
    m = torch.tensor(starts, device=device).repeat_interleave(k)  # each mask's start
    i = torch.arange(k, device=device).repeat(len(starts))  # each mask's place in its group
    positions = torch.cat([torch.arange(length, device=device), m + i])
    allowed = torch.zeros(n, n, dtype=torch.bool, device=device)
    allowed[:length, :length] = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed[length:, :length] = torch.arange(length, device=device)[None] < m[:, None]
    group = torch.arange(len(starts), device=device).repeat_interleave(k)
    allowed[length:, length:] = (group[:, None] == group[None]) & (i[:, None] >= i[None])
    return allowed, positions


@torch.no_grad()
def mask_top1(model, rows, k: int, mask_token_id: int, stride: int = 8) -> tuple[list[float], int]:
    """``([AR, mask 1, ..., mask k] top-1, spans)`` over ``rows`` (``input_ids`` / ``labels`` of SFT samples,
    prompt labelled -100) with a mask span starting at every ``stride``-th possible start of each answer. One
    forward per row scores all its spans (:func:`span_inputs`; ``tests/test_space_eval.py`` checks it equals feeding
    each span's SAR view alone)."""
    from hf_specdec.core.sliding_window import LayerMasks

    device, masks = model.device, LayerMasks(model)
    hits, spans = torch.zeros(k + 1, device=device), 0
    for row in rows:
        ids, labels = list(row["input_ids"]), list(row["labels"])
        starts = _spans(labels, k, stride)
        if not starts:
            continue
        allowed, positions = span_inputs(len(ids), starts, k, device)
        fed = torch.tensor(ids + [mask_token_id] * (k * len(starts)), device=device)[None]
        logits = model(
            input_ids=fed,
            position_ids=positions[None],
            attention_mask=masks(allowed[None, None], positions[None], positions[None]),
        ).logits[0]
        m = torch.tensor(starts, device=device)
        target = torch.tensor(labels, device=device)
        ar = logits[m - 1].argmax(-1) == target[m]
        groups = logits[len(ids) :].argmax(-1).view(len(starts), k)
        on = groups == target[m[:, None] + torch.arange(1, k + 1, device=device)]
        hits += torch.cat([ar[:, None], on], dim=1).float().sum(0)
        spans += len(starts)
    return [round(x, 4) for x in (hits / max(spans, 1)).tolist()], spans


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from hf_specdec.extras import require_extra
    from hf_specdec.space.adapter import CARD_JSON, is_space_adapter, load_space_model
    from hf_specdec.target import load_target, resolve_model_path

    from ..data.tokenized import first_turns, first_turns_source

    require_extra("train", need="python -m hf_specdec.trainers.space.eval")
    p = argparse.ArgumentParser(
        prog="python -m hf_specdec.trainers.space.eval", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", required=True, help="a `train space` final folder or its adapter folder")
    p.add_argument("--base", default=None, help="the adapter's base (default: the default target)")
    p.add_argument(
        "--corpus", default=None, help="validation first turns from this token corpus (default ShareGPT)"
    )
    p.add_argument("--samples", type=int, default=64, help="held-out first turns")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--stride", type=int, default=8)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--add-to-card", action="store_true", help="write the figures into --model's card")
    args = p.parse_args(argv)
    card = Path(args.model) / CARD_JSON
    if args.add_to_card and not card.is_file():
        raise SpecDecError(
            f"--add-to-card: {args.model} has no {CARD_JSON}; give a folder `hf-specdec train space` wrote "
            "(OUTPUT/final or OUTPUT/adapter), or leave out --add-to-card to print the figures only"
        )
    if is_space_adapter(args.model):
        model, _ = load_space_model(args.dtype, adapter=args.model, base=args.base)
    else:
        model, _ = load_target(args.model, args.dtype)
    # the base's tokenizer, without [M]: the one a corpus was made with (its folder, not a second copy of the model)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.base))
    model.eval()
    rows = first_turns(tokenizer, "validation", args.max_length, args.samples, args.corpus)
    cfg = model.config
    top1, spans = mask_top1(model, rows, cfg.space_k, cfg.space_mask_token_id, args.stride)
    result = {
        "model": args.model,
        "data": first_turns_source(args.corpus),
        "samples": len(rows),
        "spans": spans,
    }
    print(json.dumps(dict(result, top1_ar=top1[0], top1_masks=top1[1:])))
    if args.add_to_card:
        from .card import write_model_card

        info = json.loads(card.read_text())
        command = "python -m hf_specdec.trainers.space.eval " + shlex.join(
            sys.argv[1:] if argv is None else argv
        )
        info["mask_top1"] = {
            "ar": top1[0],
            "masks": top1[1:],
            "spans": spans,
            "data": result["data"],
            "samples": len(rows),
            "command": command,
        }
        write_model_card(Path(args.model), info, adapter=is_space_adapter(args.model))


if __name__ == "__main__":
    try:
        main()
    except SpecDecError as e:  # a clear message, not a traceback, as `hf-specdec` prints one
        sys.exit(f"error: {e}")
