"""A drafter attached to its frozen target: the plumbing shared by EDD (ACL 2025, §3.1) and GLIDE
(GLIDE, arXiv:2402.02082, §4.1).

Both drafters use the target's token embedding and LM head (frozen, never stored in the drafter
checkpoint), so a drafter is *attached* to its target at load time (``Drafter.from_pretrained(path,
target=target)``, ``drafter.attach_target(target)``, or automatically by ``target.generate(**inputs,
assistant_model=drafter)``). The target is kept outside the module tree (``self.__dict__["_target"]``): it is
neither a submodule nor saved, so the checkpoint holds the drafter's own weights only. The drafter's config
records the target's fingerprint (``hf_specdec.target.target_fingerprint``); attaching another target is a
clear error.

**Reduced draft vocabulary** (optional, both drafters): ``set_draft_vocab(ids)`` keeps only the LM-head rows of
``ids`` (e.g. the most frequent tokens of the training data; stored in the checkpoint as the buffer
``draft_vocab_ids``, its size in ``config.draft_vocab_size``). On a CPU the drafter's cost is mostly its LM head
(49k rows for SmolLM2), so this cuts the draft cost several times. The head rows are the target's frozen ones,
so restricting a drafter trained over the full vocabulary changes nothing but the softmax's support. The target
still verifies over the full vocabulary: full-vocabulary logits are ``-inf`` outside the kept ids, so the output
stays lossless (a token the drafter cannot propose is simply never drafted).
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from hf_specdec.checkpoint_errors import checkpoint_error
from hf_specdec.errors import SpecDecError
from hf_specdec.kernels import PackedLinear
from hf_specdec.target import check_fingerprint

_Drafter = TypeVar("_Drafter", bound="TargetAttachedMixin")


class TargetAttachedMixin:
    """Mixin for a drafter ``PreTrainedModel`` whose embedding and LM head are its target's; list it first
    among the bases (its ``from_pretrained`` wraps ``PreTrainedModel``'s). The config needs
    ``target_num_hidden_layers``, ``hidden_size`` and the fingerprint field named by ``fingerprint_field``;
    class-specific attach work goes in :meth:`_attach_extra`."""

    drafter_name = "drafter"  # the method's name in messages ("EDD", "GLIDE")
    # Chains (``assistant_model=``) stop drafting when a token no longer pays for its cost on this machine
    # (``core/draft_budget.DraftBudget``); False: always gamma tokens, as the papers draft.
    chain_cost = True
    fingerprint_field = "target_info"  # the config field holding the target's fingerprint

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
        output = target.get_output_embeddings()
        head = output.weight
        if self.draft_vocab_ids is not None:
            head = head.detach()[self.draft_vocab_ids.to(head.device)].clone()
        elif isinstance(output, PackedLinear):  # hf_specdec.apply_kernels(target): share its packed head
            head = output
        self.__dict__["_head"] = head
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

    # ---------------------------------------------------------------- draft vocabulary (module docstring)
    def _init_draft_vocab(self) -> None:
        """Call in ``__init__``: the ``draft_vocab_ids`` buffer when ``config.draft_vocab_size`` is set."""
        size = getattr(self.config, "draft_vocab_size", None)
        if size:
            # device: __init__ builds the module on the default device; .to(...) moves buffers with it
            self.register_buffer("draft_vocab_ids", torch.arange(size), persistent=True)
        else:
            self.draft_vocab_ids = None

    def set_draft_vocab(self, token_ids) -> None:
        """Keep only the LM-head rows of ``token_ids`` (any order, no repeats); works on a trained drafter too."""
        device = next(self.parameters()).device
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=device).flatten().sort().values
        vocab = self.config.vocab_size
        if len(ids) == 0 or len(ids) > vocab or bool((ids[1:] == ids[:-1]).any()):
            raise SpecDecError(f"a draft vocabulary needs 1..{vocab} distinct token ids, got {len(ids)} ids")
        if int(ids[0]) < 0 or int(ids[-1]) >= vocab:
            raise SpecDecError(
                f"draft vocabulary ids must lie in [0, {vocab}), got {int(ids[0])}..{int(ids[-1])}"
            )
        self.config.draft_vocab_size = len(ids)
        self.__dict__.pop("draft_vocab_ids", None)
        self.register_buffer("draft_vocab_ids", ids, persistent=True)
        if self.target is not None:
            self.attach_target(self.target)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits over the draft vocabulary (the full vocabulary unless one was set)."""
        self._require_target()
        head = self.__dict__["_head"]
        if isinstance(head, PackedLinear):  # hf_specdec.apply_kernels
            return head(hidden.to(head.packed.dtype))
        return F.linear(hidden, head.to(hidden.dtype))

    def to_full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits -> full-vocabulary logits (``-inf`` for tokens the drafter cannot propose)."""
        if self.draft_vocab_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab_ids, logits)

    def to_draft_ids(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids -> draft-vocabulary indices (-100 for ids outside it; -100 stays -100)."""
        if self.draft_vocab_ids is None:
            return token_ids
        table = torch.full((self.config.vocab_size,), -100, dtype=torch.long, device=token_ids.device)
        table[self.draft_vocab_ids] = torch.arange(len(self.draft_vocab_ids), device=token_ids.device)
        return torch.where(token_ids >= 0, table[token_ids.clamp(min=0)], token_ids)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path, *args, target: PreTrainedModel | None = None, **kwargs
    ):
        """``from_pretrained`` plus ``target=``: attach (and check) the target the drafter belongs to. A truncated
        or corrupt checkpoint is a :class:`SpecDecError` naming the file (also through ``AutoModelForCausalLM``)."""
        from safetensors import SafetensorError

        try:
            model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except (SafetensorError, OSError) as exc:
            raise checkpoint_error(
                pretrained_model_name_or_path,
                exc,
                f"{cls.drafter_name} drafter",
                "re-download the drafter or re-train it (`hf-specdec train ...`)",
            ) from None
        if target is not None:
            model.attach_target(target)
        return model

    def generate(self, *args, **kwargs):
        """A drafter does not generate on its own (it reads its target's state). Reached when it is passed as
        ``assistant_model`` but transformers ran its own assisted loop instead of the tree core's
        (``hf_specdec.core.assisted``): an error, never a silent fallback to another method."""
        raise SpecDecError(
            f"{type(self).__name__} was given as assistant_model, but transformers ran its own assisted loop "
            "with it (its generic assisted generator called drafter.generate) instead of hf_specdec's: this "
            "transformers version changed how generate runs assisted decoding (hf_specdec/hf_compat, "
            "assisted_decoding); use a supported transformers version or `import hf_specdec` before generate"
        )

    def get_input_embeddings(self) -> nn.Module | None:
        return None if self.target is None else self.target.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module | None:
        return None
