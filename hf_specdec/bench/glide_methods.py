"""Bench methods ``glide`` and ``vanilla-draft``: ``target.generate(assistant_model=drafter)`` with a trained
GLIDE drafter (glide-cape.txt §4.1) or the vanilla drafter (same architecture without cross-attention, §5.2).

Checkpoints come from ``--option glide=PATH`` / ``--option vanilla=PATH``; by default ``runs/glide-smollm2`` and
``runs/vanilla-smollm2`` (what ``hf-specdec train glide`` writes in the docs' recipe), then the GLIDE checkpoint
shipped in the package (``hf_specdec/resources/glide-smollm2``). ``--option gamma=N`` sets the number of draft
tokens per round (default 5). Stats are inferred from the target's forwards (``stats.ForwardMeter``).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecDecError
from .methods import Method, greedy_new_tokens, register

PACKAGED = Path(__file__).resolve().parent.parent / "resources"
DEFAULTS = {
    "glide": [Path("runs/glide-smollm2"), PACKAGED / "glide-smollm2"],
    "vanilla": [Path("runs/vanilla-smollm2"), PACKAGED / "vanilla-smollm2"],
}


def find_checkpoint(kind: str, option: str | None) -> Path:
    """The drafter folder for ``kind`` ('glide' or 'vanilla'): the option if given, else the first default."""
    candidates = [Path(option)] if option else DEFAULTS[kind]
    for path in candidates:
        if (path / "config.json").is_file():
            return path
    raise SpecDecError(
        f"no {kind} drafter checkpoint at {', '.join(map(str, candidates))}: train one with "
        f"`hf-specdec train glide {'--no-cross-attention ' if kind == 'vanilla' else ''}--output-dir "
        f"{DEFAULTS[kind][0]}` or pass --option {kind}=PATH"
    )


class _DrafterMethod(Method):
    kind = "glide"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        from hf_specdec.modeling import GlideForCausalLM

        path = find_checkpoint(self.kind, ctx.options.get(self.kind))
        self.drafter = GlideForCausalLM.from_pretrained(path, target=ctx.model, dtype=ctx.model.dtype).eval()
        if "gamma" in ctx.options:
            self.drafter.generation_config.num_assistant_tokens = int(ctx.options["gamma"])

    def generate(self, input_ids, max_new_tokens):
        return greedy_new_tokens(self.model, input_ids, max_new_tokens, assistant_model=self.drafter), None


@register
class Glide(_DrafterMethod):
    name = "glide"
    description = "GLIDE drafter (cross-attention into the target's KV cache) via assistant_model, gamma=5"
    kind = "glide"


@register
class VanillaDraft(_DrafterMethod):
    name = "vanilla-draft"
    description = "vanilla drafter (GLIDE without cross-attention) via assistant_model, gamma=5"
    kind = "vanilla"
