"""A drafter attached to its frozen target: the plumbing shared by EDD (edd-pct.txt §3.1) and GLIDE
(glide-cape.txt §4.1).

Both drafters use the target's token embedding and LM head (frozen, never stored in the drafter
checkpoint), so a drafter is *attached* to its target at load time (``Drafter.from_pretrained(path,
target=target)``, ``drafter.attach_target(target)``, or automatically by ``target.generate(**inputs,
assistant_model=drafter)``). The target is kept outside the module tree (``self.__dict__["_target"]``): it is
neither a submodule nor saved, so the checkpoint holds the drafter's own weights only. The drafter's config
records the target's fingerprint (``hf_specdec.target.target_fingerprint``); attaching another target is a
clear error.
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn
from transformers import PreTrainedModel

from hf_specdec.errors import SpecDecError
from hf_specdec.target import check_fingerprint

_Drafter = TypeVar("_Drafter", bound="TargetAttachedMixin")


class TargetAttachedMixin:
    """Mixin for a drafter ``PreTrainedModel`` whose embedding and LM head are its target's; list it first
    among the bases (its ``from_pretrained`` wraps ``PreTrainedModel``'s). The config needs
    ``target_num_hidden_layers``, ``hidden_size`` and the fingerprint field named by ``fingerprint_field``;
    class-specific attach work goes in :meth:`_attach_extra`."""

    drafter_name = "drafter"  # the method's name in messages ("EDD", "GLIDE")
    fingerprint_field = "target"  # the config field holding the target's fingerprint

    @property
    def target(self) -> PreTrainedModel | None:
        return self.__dict__.get("_target")

    def attach_target(self: _Drafter, target: PreTrainedModel) -> _Drafter:
        """Share ``target``'s embedding and LM head (plus :meth:`_attach_extra`); raise if ``target`` is not
        this drafter's target (another fingerprint, or another depth / width)."""
        what = f"this {self.drafter_name} drafter"
        fingerprint = getattr(self.config, self.fingerprint_field)
        if fingerprint:
            check_fingerprint(fingerprint, target, what=what)
        tc = target.config.get_text_config()
        expected = (self.config.target_num_hidden_layers, self.config.hidden_size)
        if (tc.num_hidden_layers, tc.hidden_size) != expected:
            raise SpecDecError(
                f"{what} expects a target with {expected[0]} layers of width {expected[1]}, got "
                f"{tc.num_hidden_layers} x {tc.hidden_size}; use the target it was trained for"
            )
        self._attach_extra(target)
        self.__dict__["_target"] = target
        return self

    def _attach_extra(self, target: PreTrainedModel) -> None:
        """Class-specific attach work, run after the checks and before the target is stored (may raise)."""

    def _require_target(self) -> PreTrainedModel:
        if self.target is None:
            raise SpecDecError(
                f"this {self.drafter_name} drafter is not attached to its target (its embedding and LM head "
                "are the target's and are not stored in the checkpoint): load it with "
                f"`{type(self).__name__}.from_pretrained(path, target=target)`, call "
                "`drafter.attach_target(target)`, or pass it as "
                "`target.generate(..., assistant_model=drafter)`"
            )
        return self.target

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *args, target: PreTrainedModel | None = None, **kwargs
    ):
        """``from_pretrained`` plus ``target=``: attach (and check) the target the drafter belongs to."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        if target is not None:
            model.attach_target(target)
        return model

    def get_input_embeddings(self) -> nn.Module | None:
        return None if self.target is None else self.target.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module | None:
        return None
