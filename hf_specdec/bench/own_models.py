"""Bench and demo methods set up on one target, and the methods that decode a model of their own.

Every method runs the bench's target (``--model``, else the default target) except one whose setup loads a model of
its own (``runner.model`` is not the target): ``space`` when the target is not a SAR-SFT model decodes the shipped
SAR-SFT model (or ``--option space_model=PATH``, ``bench/space_methods.py``), so a bench of ``ar,glide-cape,space``
runs GLIDE on the default target it was trained for and SPACE on its own weights. Such a method is judged lossless
against plain greedy ``generate`` of its own model (:class:`OwnModels` runs it, untimed, once per prompt or row),
while its ``speedup`` stays over ``ar`` on the bench target, like every other method's; the results' ``config``
names the model each such method ran (``own_models``) and says so in its ``model`` line, which the report prints.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..core.lossless import Verdict, compare_outputs
from ..errors import SpecDecError
from .methods import AutoRegressive, BenchContext, Method


def setup_runners(names: list[str], classes: list[type[Method]], ctx: BenchContext) -> dict[str, Method]:
    """Each method set up on ``ctx``, in order. With an explicit ``--model`` (``ctx.model_name``), a method that
    cannot run on it (a drafter trained for another target, no SAR-SFT weights for ``space``...) fails here, before
    any decoding, with its reason and what to do."""
    runners = {}
    for name, cls in zip(names, classes):
        runner = cls()
        try:
            runner.setup(ctx)
        except SpecDecError as err:
            if ctx.model_name is None or str(err).startswith(f"--model {ctx.model_name} "):
                raise
            raise SpecDecError(
                f"--model {ctx.model_name} cannot serve method {name!r}: {err}. Leave {name} out of this run, or "
                "omit --model (every method then runs the target it was made for: the default target, and the "
                "shipped SAR-SFT model for space)"
            ) from None
        runners[name] = runner
    return runners


class OwnModels:
    """The methods among ``runners`` that decode a model of their own, and plain greedy ``generate`` of that model
    (module docstring), the reference their outputs are compared with."""

    def __init__(self, runners: dict[str, Method], target, ctx: BenchContext):
        self.target = target
        self.models = {
            name: r.model
            for name, r in runners.items()
            if r.model is not target and not getattr(r, "same_target", False)
        }
        self.sources = {
            name: str(getattr(runners[name], "model_source", None) or "a model of its own")
            for name in self.models
        }
        self._ar: dict[int, AutoRegressive] = {}
        for model in self.models.values():
            if id(model) not in self._ar:
                self._ar[id(model)] = AutoRegressive()
                self._ar[id(model)].setup(replace(ctx, model=model))
        self._done: dict[tuple, list[int]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.models

    def model_line(self, target_line: str) -> str:
        """The results' ``config.model`` (the report's model line): the target, and which methods decoded which
        model of their own."""
        if not self.sources:
            return target_line
        own = ", ".join(f"`{name}`, which decoded {source}" for name, source in self.sources.items())
        return (
            f"{target_line} for every method but {own} (lossless against plain generate of its own model, "
            "speedup over `ar`)"
        )

    def reference(self, name: str, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
        """Plain greedy ``generate`` of ``name``'s own model on ``prompt`` (1, P), untimed (once per prompt)."""
        model = self.models[name]
        key = (id(model), tuple(prompt[0].tolist()), max_new_tokens)
        if key not in self._done:
            tokens, _ = self._ar[id(model)].generate(prompt.to(model.device), max_new_tokens)
            self._done[key] = [int(t) for t in tokens]
        return self._done[key]

    def verdict(
        self,
        name: str,
        prompt: torch.Tensor,
        ar_tokens: list[int],
        tokens: list[int],
        max_new_tokens: int,
        tie_tol,
    ) -> Verdict:
        """``tokens`` of method ``name`` against ``ar`` on the target (``ar_tokens``), or against plain generate of
        the method's own model."""
        if name not in self.models:
            return compare_outputs(self.target, prompt, ar_tokens, tokens, tie_tol)
        model = self.models[name]
        reference = self.reference(name, prompt, max_new_tokens)
        return compare_outputs(model, prompt.to(model.device), reference, tokens, tie_tol)

    def row_record(
        self,
        name: str,
        prompt: torch.Tensor,
        tokens: list[int],
        max_new_tokens: int,
        tie_tol,
        check_rows: bool,
    ) -> dict:
        """A batch row's losslessness (the fields of ``figures.row_verdict``) for a method with its own model: its
        reference is plain generate of that model on the row alone, which is also the row-alone check."""
        v = self.verdict(name, prompt, [], tokens, max_new_tokens, tie_tol)
        rec = {"identical": v.identical, "lossless": v.lossless, "first_diff": v.first_diff, "gap": v.gap}
        rec["reason"] = v.reason and f"vs plain generate of {self.sources[name]}: {v.reason}"
        if check_rows:
            rec.update(row_alone_identical=v.identical, row_alone_lossless=v.lossless)
        return rec
