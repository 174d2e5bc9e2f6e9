"""Bench method ``space``: SPACE auto-correct decoding (space.txt §3.2) of a SAR-SFT model.

The harness's ``ar`` reference runs the model given by ``--model``, so bench the SAR-SFT checkpoint itself::

    hf-specdec bench --model runs/space-sar/final --methods ar,space ...

then ``ar`` and ``space`` run the same weights and the lossless column is meaningful. Options:
``--option space_masks=N`` (masks per group, default the trained k) and ``--option space_model=PATH``,
used only when ``--model`` is not a SPACE model (default ``$HF_SPECDEC_HOME/space/sar-sft``): the method then
decodes with that checkpoint while ``ar`` decodes ``--model``, so speed compares two different models and
the lossless check fails by construction — a warning says so.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..errors import SpecDecError
from ..stats import DecodeStats
from ..target import home, load_target
from .methods import BenchContext, Method, register

logger = logging.getLogger(__name__)


def default_space_model() -> Path:
    return home() / "space" / "sar-sft"


@register
class Space(Method):
    name = "space"
    description = (
        "SPACE auto-correct decoding of a SAR-SFT model (bench with --model <the SAR-SFT checkpoint>)"
    )

    def setup(self, ctx: BenchContext) -> None:
        super().setup(ctx)
        self.masks = int(ctx.options["space_masks"]) if "space_masks" in ctx.options else None
        if getattr(ctx.model.config, "space_mask_token_id", None) is None:
            path = Path(ctx.options.get("space_model") or default_space_model())
            if not (path / "config.json").is_file():
                raise SpecDecError(
                    f"--model is not a SAR-SFT model and {path} holds none; train one with "
                    "`hf-specdec train space --output-dir DIR` and bench with --model DIR/final"
                )
            logger.warning(
                "bench method space: --model is not a SPACE model, decoding %s instead; `ar` runs a different "
                "model, so speedup and lossless compare two models (pass --model %s)",
                path,
                path,
            )
            self.model, _ = load_target(str(path), ctx.dtype)
            self.model.to(ctx.model.device)
        from .. import space

        self.generate_fn = space

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int):
        stats = DecodeStats()
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            custom_generate=self.generate_fn,
            num_masks=self.masks,
            stats=stats,
        )
        return out[0, input_ids.shape[1] :], stats
