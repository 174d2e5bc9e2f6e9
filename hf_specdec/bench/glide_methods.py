"""Bench methods ``glide`` and ``vanilla-draft``: ``target.generate(assistant_model=drafter)`` with a trained
GLIDE drafter (GLIDE, arXiv:2402.02082, §4.1) or the vanilla drafter (same architecture without cross-attention, §5.2).

Checkpoints come from ``--option glide=PATH`` / ``--option vanilla=PATH``; by default ``runs/glide-smollm2`` and
``runs/vanilla-smollm2`` (what ``hf-specdec train glide`` writes in the docs' recipe) when made for the bench's
target, then the one shipped in the package for that target (``hf_specdec/shipped.py``: ``resources/glide-*``). ``--option gamma=N`` sets the number of draft
tokens per round (default 5), ``chain_cost=0`` drafts all of them (default 1: the chain stops at a token that does
not pay its cost on this machine, ``core/draft_budget.DraftBudget``). The chain runs in the tree core's loop
(``core/assisted.py``); stats are inferred from the target's forwards (``stats.ForwardMeter``). At
``--batch-size B > 1`` both take the batch in one ``generate(assistant_model=drafter)`` call (each row drafts its
own chain) and report the loop's stats.

``glide-cape``: the same GLIDE checkpoint with CAPE (§4.2, ``hf_specdec.glide.cape``): gamma = 5 proposal tokens plus
confidence-sized expansion sets, verified as one token tree per target forward through ``custom_generate=
hf_specdec.glide_cape``. It returns its own ``DecodeStats`` (tau = new tokens per target forward; drafted = all
tree nodes, so alpha is per node; nodes per step in ``DecodeStats.steps``). Options: ``gamma``, and
``cape_bins=0.3:7,0.6:5,0.8:3,1:1`` (S(p) as upper:K pairs), ``cape_cost=0`` (keep all of S(p); default 1: drop
expansion tokens that do not pay their measured verification cost, see ``hf_specdec/glide/cape.py``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecDecError
from ..shipped import made_for, shipped_checkpoint, shipped_targets
from .methods import GenerateCallMethod, batched_assisted, register

TRAINED = {"glide": Path("runs/glide-smollm2"), "vanilla": Path("runs/vanilla-smollm2")}  # the docs' recipe


def find_checkpoint(kind: str, option: str | None, model) -> Path:
    """The drafter folder for ``kind`` ('glide' or 'vanilla') on the target ``model``: the option if given, else
    :data:`TRAINED` when made for ``model``, else the one shipped for ``model``."""
    if option:
        if not (Path(option) / "config.json").is_file():
            raise SpecDecError(f"--option {kind}={option}: no drafter checkpoint there (no config.json)")
        return Path(option)
    trained = TRAINED[kind]
    if (trained / "config.json").is_file() and made_for(kind, trained, model):
        return trained
    shipped = shipped_checkpoint(kind, model)
    if shipped is not None:
        return shipped
    raise SpecDecError(
        f"no {kind} drafter for this target (one ships for: {', '.join(shipped_targets(kind)) or 'none'}): train "
        f"one with `hf-specdec train glide --model MODEL {'--no-cross-attention ' if kind == 'vanilla' else ''}"
        f"--output-dir DIR` and pass --option {kind}=DIR"
    )


class _DrafterMethod(GenerateCallMethod):
    kind = "glide"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        from hf_specdec.modeling import GlideForCausalLM

        path = find_checkpoint(self.kind, ctx.options.get(self.kind), ctx.model)
        self.drafter = GlideForCausalLM.from_pretrained(path, target=ctx.model, dtype=ctx.model.dtype).eval()
        if "gamma" in ctx.options:
            self.drafter.generation_config.num_assistant_tokens = int(ctx.options["gamma"])
        self.drafter.chain_cost = ctx.options.get("chain_cost", "1") != "0"

    def generate_kwargs(self) -> dict:
        return dict(assistant_model=self.drafter)  # routed into the tree core's loop (core/assisted.py)


class _ChainMethod(_DrafterMethod):
    batchable = True

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        return batched_assisted(self, input_ids, attention_mask, max_new_tokens)


@register
class Glide(_ChainMethod):
    name = "glide"
    description = "GLIDE drafter (cross-attention into the target's KV cache) via assistant_model, gamma=5"
    kind = "glide"


@register
class VanillaDraft(_ChainMethod):
    name = "vanilla-draft"
    description = "vanilla drafter (GLIDE without cross-attention) via assistant_model, gamma=5"
    kind = "vanilla"


def parse_bins(text: str) -> list[tuple[float, int]]:
    """``"0.3:7,0.6:5,0.8:3,1:1"`` -> ``[(0.3, 7), (0.6, 5), (0.8, 3), (1.0, 1)]`` (CAPE's S(p))."""
    try:
        return [(float(u), int(k)) for u, k in (pair.split(":") for pair in text.split(","))]
    except ValueError as err:
        raise SpecDecError(
            f"bad --option cape_bins={text!r}: give upper:K pairs, e.g. cape_bins=0.3:7,0.6:5,0.8:3,1:1"
        ) from err


@register
class GlideCape(_DrafterMethod):
    name = "glide-cape"
    description = "GLIDE + CAPE: gamma=5 chain + 7/5/3/1 siblings by confidence, one tree per forward"
    kind = "glide"
    stats_kwarg = True
    batchable = True

    def setup(self, ctx) -> None:
        super().setup(ctx)
        from hf_specdec.glide.expansion import DEFAULT_EXPANSION, check_expansion

        bins = ctx.options.get("cape_bins")
        self.expansion = check_expansion(parse_bins(bins) if bins else DEFAULT_EXPANSION)
        self.cost = ctx.options.get("cape_cost", "1") not in ("0", "false", "False", "no")

    def generate_kwargs(self) -> dict:
        from hf_specdec.glide.cape import glide_cape

        return dict(
            custom_generate=glide_cape,
            drafter=self.drafter,
            cape_expansion=self.expansion,
            cape_cost=self.cost,
        )
