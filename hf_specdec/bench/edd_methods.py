"""Bench methods for EDD (ACL 2025, §3.1) and its candidate trees (§3.2, App. A).

- ``edd``: chain drafts of up to gamma = 5 through ``target.generate(assistant_model=edd)`` (Table 1's setting; the
  tree core's loop, ``core/assisted.py``); stats inferred from the target's forwards; at ``--batch-size B > 1`` one
  call per batch and the loop's stats.
- ``edd-pct``: PCT (width 5, max depth 10, removal threshold 0.01, s_d/s_t measured while decoding).
- ``edd-vct``: the vanilla candidate tree, width 3, depth 5 (App. A).
- ``edd-eagle2``: EAGLE-2-style re-ranked tree, top-10 expansion, depth 6, 50 nodes (App. A).

Trees run in the tree core's ``tree_generate`` and report their own ``DecodeStats`` (nodes per step in
``steps``). Checkpoint: ``--option edd=PATH``, else ``runs/edd-smollm2`` (what ``hf-specdec train edd`` writes in
docs/edd-pct.md) when made for the target, else the one shipped for the target (``edd/checkpoint.py``). Table 3's ablations are
checkpoints trained with ``--no-soft-prompt`` / ``--loss ce`` / ``--block-min 5 --block-max 5`` benched with
``--option edd=PATH``. Other options: ``gamma`` (chain length), ``chain_cost=0`` (the chain always drafts gamma
tokens, as the paper; default 1: it stops at a token that does not pay its cost, ``core/draft_budget.DraftBudget``),
``pct_width``, ``pct_depth``, ``pct_removal``,
``pct_ratio`` (pin s_d/s_t instead of measuring it), ``pct_temperature`` (confidence temperature instead of the
drafter's calibrated one), ``eagle2_total``.
"""

from __future__ import annotations

from ..edd.checkpoint import find_edd_checkpoint
from .methods import GenerateCallMethod, Method, batched_assisted, greedy_new_tokens, register

_LOADED: dict[tuple[str, int], object] = {}


def load_edd(ctx):
    """One EDD per (checkpoint, target) for all the EDD methods of a bench run."""
    from hf_specdec.modeling import EddForCausalLM

    path = find_edd_checkpoint(ctx.options.get("edd"), ctx.model)
    key = (str(path.resolve()), id(ctx.model))
    if key not in _LOADED:
        _LOADED[key] = EddForCausalLM.from_pretrained(path, target=ctx.model, dtype=ctx.model.dtype).eval()
    return _LOADED[key]


@register
class EddChain(Method):
    name = "edd"
    description = "EDD drafter, chain of gamma=5 drafts via assistant_model"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.edd = self.drafter = load_edd(ctx)
        if "gamma" in ctx.options:
            self.edd.generation_config.num_assistant_tokens = int(ctx.options["gamma"])
        self.edd.chain_cost = ctx.options.get("chain_cost", "1") != "0"

    batchable = True

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens, assistant_model=self.edd), None

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        return batched_assisted(self, input_ids, attention_mask, max_new_tokens)


class _EddTree(GenerateCallMethod):
    builder = "pct"
    stats_kwarg = True
    batchable = True

    def setup(self, ctx) -> None:
        super().setup(ctx)
        from hf_specdec.edd.tree_proposer import EddTreeProposer

        o = ctx.options
        kwargs = {}
        if self.builder == "pct":
            kwargs = dict(
                width=int(o.get("pct_width", 5)),
                depth=int(o.get("pct_depth", 10)),
                removal_threshold=float(o.get("pct_removal", 0.01)),
                ratio=float(o["pct_ratio"]) if "pct_ratio" in o else None,
                confidence_temperature=float(o["pct_temperature"]) if "pct_temperature" in o else None,
                cost=o.get("pct_cost", "1") not in ("0", "false", "False", "no"),
            )
        elif self.builder == "eagle2":
            kwargs = dict(total_tokens=int(o.get("eagle2_total", 50)))
        self.drafter = load_edd(ctx)
        self.proposer = EddTreeProposer(self.drafter, self.builder, **kwargs)

    def generate_kwargs(self) -> dict:
        from hf_specdec.core.tree_decoding import tree_generate

        return dict(custom_generate=tree_generate, proposer=self.proposer)


@register
class EddPct(_EddTree):
    name = "edd-pct"
    description = "EDD + Pruned Candidate Tree (width 5, depth <= 10, measured s_d/s_t, removal 0.01)"
    builder = "pct"


@register
class EddVct(_EddTree):
    name = "edd-vct"
    description = "EDD + vanilla candidate tree (width 3, depth 5)"
    builder = "vct"


@register
class EddEagle2(_EddTree):
    name = "edd-eagle2"
    description = "EDD + EAGLE-2-style re-ranked tree (top-10, depth 6, 50 nodes)"
    builder = "eagle2"
