"""Bench method ``space``: SPACE auto-correct decoding (SPACE, arXiv:2402.11809, §3.2) of a SAR-SFT model.

Which weights ``space`` decodes:

- ``--model`` is a SAR-SFT model (your merged ``OUTPUT/final`` or ``OUTPUT/adapter``): that model, like every other
  method, so ``ar`` and ``space`` run the same weights::

      hf-specdec bench --model runs/space-sar/final --methods ar,space ...

- ``--model`` not a SAR-SFT model (the default target, a named target...): the SAR-SFT adapter shipped for that
  target (``hf_specdec/shipped.py``: ``resources/space-*``) merged into it, while every other method, ``ar``
  included, runs the plain target; so ``ar,glide-cape,edd-pct,space`` runs in one bench, each method on the
  weights it was made for.
- ``--option space_model=PATH``: that SAR-SFT checkpoint (a merged model, or an adapter, merged into ``--model``),
  when ``--model`` is not one.
- ``--model`` not a SAR-SFT model, no ``space_model`` and no adapter shipped for it: refused at set-up.

When ``space`` decodes a model of its own, its lossless column is against plain greedy ``generate`` of that model
(run by the bench, untimed) and its speedup is over ``ar`` on the bench's target (``bench/own_models.py``); the
report's model line says so. ``--option space_masks=N``: masks per group (default the card's, else the trained k);
``--option space_cost=0``: verify every candidate (the paper; default 1: those that pay their cost).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from ..core.batch_io import pad_token_id
from ..errors import SpecDecError
from ..shipped import shipped_checkpoint, shipped_targets
from ..space.adapter import is_space_adapter, load_model
from .methods import BenchContext, Method, batched_greedy_with_stats, greedy_with_stats, register

logger = logging.getLogger(__name__)


@register
class Space(Method):
    name = "space"
    description = (
        "SPACE auto-correct decoding of a SAR-SFT model (bench with --model <the SAR-SFT checkpoint>)"
    )

    def setup(self, ctx: BenchContext) -> None:
        super().setup(ctx)
        self.masks = int(ctx.options["space_masks"]) if "space_masks" in ctx.options else None
        self.space_cost = ctx.options.get("space_cost", "1") != "0"
        self.model_source = None  # the SAR-SFT checkpoint it loaded when the target is not one
        if getattr(ctx.model.config, "space_mask_token_id", None) is None:
            option = ctx.options.get("space_model")
            path = Path(option) if option is not None else shipped_checkpoint("space", ctx.model)
            if path is None:
                raise SpecDecError(
                    f"--model {ctx.model_name} is not a SAR-SFT model (its config has no space_mask_token_id) and "
                    f"no SAR-SFT adapter ships for it (one ships for: {', '.join(shipped_targets('space'))}), so "
                    "space cannot decode it; train one with `hf-specdec train space --model MODEL --output-dir DIR` "
                    "and pass --option space_model=DIR/final (or --model DIR/final)"
                )
            if not ((path / "config.json").is_file() or is_space_adapter(path)):
                raise SpecDecError(
                    f"--option space_model={path} holds no SAR-SFT model; train one with `hf-specdec train space "
                    "--output-dir DIR` and pass --option space_model=DIR/final (or DIR/adapter)"
                )
            logger.info(
                "bench method space decodes %s, judged against plain generate of that model; the other methods "
                "run the target, and space's speedup is over `ar` on it",
                path,
            )
            self.model, _ = load_model(str(path), ctx.dtype, base=ctx.model_name)
            self.model.to(ctx.model.device)
            self.model_source = str(path)
        from ..space import space_generate

        self.generate_fn = space_generate

    batchable = True

    def generate_kwargs(self) -> dict:
        return dict(custom_generate=self.generate_fn, num_masks=self.masks, space_cost=self.space_cost)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int):
        return greedy_with_stats(self.model, input_ids, max_new_tokens, **self.generate_kwargs())

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        pad_id = pad_token_id(self.ctx.tokenizer)
        return batched_greedy_with_stats(
            self.model, input_ids, attention_mask, max_new_tokens, pad_id, **self.generate_kwargs()
        )


# --------------------------------------------------------------------------------------------- quality
def _code_of(text: str) -> str:
    """The first fenced code block of a completion (the whole text if there is none)."""
    m = re.search(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", text, re.S)
    return m.group(1) if m else text


def quality_figures(summaries: list[tuple[str, str]], programs: list[tuple[str, str]]) -> dict[str, float]:
    """The quality figures of §4.2.2 through the ``evaluate`` modules shipped in ``hf_specdec.metrics`` (what an HF
    user computes with ``evaluate.load`` of their folders): ``summarize`` = mean ROUGE-L F1 of each
    ``(source, summary)`` against the source passage (the task has no reference summaries), ``humaneval`` = pass@1
    of each ``(task_id, completion)``'s first code block, run as the whole function when it defines the entry point,
    else as the body after the prompt."""
    from ..metrics import load_metric
    from ..tasks import _humaneval_problems

    entry = {p["task_id"]: p["entry_point"] for p in _humaneval_problems()}
    rouge = load_metric("rouge_l").compute(
        predictions=[text for _, text in summaries], references=[source for source, _ in summaries]
    )
    codes = [_code_of(text) for _, text in programs]
    passed = load_metric("humaneval_pass").compute(
        predictions=codes,
        references=[task_id for task_id, _ in programs],
        complete_function=[f"def {entry[task_id]}" in code for (task_id, _), code in zip(programs, codes)],
    )
    return {"summarize": rouge["rougeL"], "humaneval": passed["pass@1"]}


def quality(
    models: dict[str, str], limit: int = 4, max_new_tokens: int = 64, dtype: str = "fp32"
) -> list[dict]:
    """SAR-SFT vs SFT on the same prompts (§4.2.2), greedy: ROUGE-L on ``summarize`` and pass@1 on ``humaneval`` of
    each model's completions, scored by :func:`quality_figures`."""
    from ..tasks import load_task

    rows = []
    for name, path in models.items():
        model, tok = load_model(path, dtype)
        outputs = {}
        for task in ("summarize", "humaneval"):
            outputs[task] = []
            for ex in load_task(task, tok, limit):
                ids = tok(ex["prompt"], return_tensors="pt").input_ids
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
                )
                text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
                outputs[task].append((ex["source"] if task == "summarize" else ex["id"], text))
        rows.append(
            {"model": name, "path": path, **quality_figures(outputs["summarize"], outputs["humaneval"])}
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from ..extras import require_extra

    require_extra("bench", need="python -m hf_specdec.bench.space_methods")
    p = argparse.ArgumentParser(description="SPACE quality check: SAR-SFT vs SFT on the same prompts")
    p.add_argument("--sar", required=True, help="SAR-SFT checkpoint folder")
    p.add_argument("--sft", required=True, help="SFT baseline (p_ar = 1) checkpoint folder")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    rows = quality({"SFT (p_ar=1)": args.sft, "SAR-SFT": args.sar}, args.limit, args.max_new_tokens)
    print("| model | ROUGE-L summarize | pass@1 humaneval |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['summarize']:.4f} | {r['humaneval']:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
