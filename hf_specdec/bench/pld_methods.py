"""Bench methods ``pld-plus-h`` and ``pld-plus-a``: PLD+ (arXiv:2412.01447) through ``custom_generate``.

Options (``hf-specdec bench --option KEY=VALUE``): ``pld_k`` (K, tokens drafted per step), ``pld_layer``
(PLD+(h)'s hidden-state index), ``pld_heads`` (PLD+(a)'s heads file; default: the shipped one),
``pld_top_heads`` (how many of its heads), ``pld_min_score`` (no draft below this score).
"""

from __future__ import annotations

from ..core.batch_io import pad_token_id
from .methods import GenerateCallMethod, batched_greedy_with_stats, register


def _pld_kwargs(options: dict) -> dict:
    kwargs = {}
    for option, name, cast in (
        ("pld_k", "pld_num_tokens", int),
        ("pld_layer", "pld_layer", int),
        ("pld_heads", "pld_heads", str),
        ("pld_top_heads", "pld_top_heads", int),
        ("pld_min_score", "pld_min_score", float),
    ):
        if option in options:
            kwargs[name] = cast(options[option])
    return kwargs


class _PLDPlus(GenerateCallMethod):
    variant = ""
    batchable = False  # PLD+(a) runs at batch size 1 (its attention rows are read per row); PLD+(h) batches

    def setup(self, ctx) -> None:
        super().setup(ctx)
        from ..pld_plus import pld_plus

        self.custom_generate = pld_plus
        self.kwargs = _pld_kwargs(ctx.options)
        if self.variant == "hidden":
            self.kwargs.pop("pld_heads", None)
            self.kwargs.pop("pld_top_heads", None)
        else:
            self.kwargs.pop("pld_layer", None)

    def generate_kwargs(self) -> dict:
        return dict(custom_generate=self.custom_generate, pld_variant=self.variant, **self.kwargs)

    def generate_batch(self, input_ids, attention_mask, max_new_tokens):
        """A batch fills ``stats=`` (at batch 1 the harness infers the stats from the target's forwards)."""
        args = (self.model, input_ids, attention_mask, max_new_tokens, pad_token_id(self.ctx.tokenizer))
        return batched_greedy_with_stats(*args, **self.generate_kwargs())


@register
class PLDPlusHidden(_PLDPlus):
    name = "pld-plus-h"
    description = "PLD+(h): prompt lookup ranked by hidden-state cosine (PLD+, arXiv:2412.01447, §4.2.2)"
    variant = "hidden"
    batchable = True


@register
class PLDPlusAttention(_PLDPlus):
    name = "pld-plus-a"
    description = "PLD+(a): prompt lookup ranked by induction-head attention (PLD+, arXiv:2412.01447, §4.2.1)"
    variant = "attention"
