"""Bench methods, pluggable by name.

A method is a class with a ``name``, an optional ``setup(ctx)`` (load a drafter, a heads file...) and
``generate(input_ids, max_new_tokens) -> (new_tokens, stats or None)``. Returning ``None`` for the
stats lets the harness infer them from the target's forwards (see ``stats.ForwardMeter.chain_stats``),
which is right for every draft-then-verify chain or tree loop that feeds the drafted tokens to the
target. Register with ``@register``; modules that define methods are listed in ``PLUGIN_MODULES``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

from ..core.stats import DecodeStats
from ..errors import SpecDecError

# Modules that register more methods on import (one line each; a missing optional part is skipped).
PLUGIN_MODULES: list[str] = [
    "hf_specdec.bench.tree_methods",
    "hf_specdec.bench.pld_methods",
    "hf_specdec.bench.glide_methods",
    "hf_specdec.bench.space_methods",
    "hf_specdec.bench.edd_methods",
]


@dataclass
class BenchContext:
    model: torch.nn.Module
    tokenizer: object
    dtype: str
    options: dict = field(default_factory=dict)  # method options from the CLI (--drafter, --heads ...)


class Method:
    name = ""
    description = ""
    drafter = None  # a drafter model (GLIDE / EDD) whose cost c the bench reports; None for the others

    def setup(self, ctx: BenchContext) -> None:
        self.ctx = ctx
        self.model = ctx.model

    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int
    ) -> tuple[torch.Tensor, DecodeStats | None]:
        raise NotImplementedError


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def greedy_new_tokens(model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
    """Greedy ``model.generate`` (batch 1, no padding) with ``kwargs``; returns the new tokens only."""
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        **kwargs,
    )
    return out[0, input_ids.shape[1] :]


def greedy_with_stats(
    model, input_ids: torch.Tensor, max_new_tokens: int, **kwargs
) -> tuple[torch.Tensor, DecodeStats]:
    """:func:`greedy_new_tokens` for a ``custom_generate`` loop that fills its own ``stats=DecodeStats()`` (trees,
    SPACE: their forwards are not "1 + drafted" tokens, so the harness cannot infer tau from the target's forwards)."""
    stats = DecodeStats()
    return greedy_new_tokens(model, input_ids, max_new_tokens, stats=stats, **kwargs), stats


@register
class AutoRegressive(Method):
    name = "ar"
    description = "plain greedy model.generate (the reference)"

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens), None


@register
class HFPromptLookup(Method):
    name = "hf-pld"
    description = "transformers' prompt lookup decoding (prompt_lookup_num_tokens=10)"

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens, prompt_lookup_num_tokens=10), None


def available_methods() -> dict[str, type[Method]]:
    """Every registered method. A plugin module whose optional third-party dependency is missing is skipped; an
    import error inside this package (a bug) is raised, so a broken module never silently drops its methods."""
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing = (err.name or "").split(".")[0]
            if not missing or missing in ("hf_specdec", "modeling", "trainers"):
                raise
    return METHODS


def get_method(name: str) -> type[Method]:
    methods = available_methods()
    if name not in methods:
        raise SpecDecError(f"unknown method {name!r}; choose from {', '.join(methods)}")
    return methods[name]
