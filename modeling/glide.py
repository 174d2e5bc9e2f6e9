"""GLIDE, the glimpse draft model (GLIDE, arXiv:2402.02082, §4.1), and its vanilla-drafter ablation (§5.2, Fig. 4).

Each of the ``N_D`` decoder layers is self-attention -> **cross-attention into the target's KV cache** ->
feed-forward. Draft layer ``m`` (0-based) reads target layer ``l = N_T - N_D + m`` (the top layers, §5.4);
``GlideConfig.target_layers`` picks others. The cross-attention projects the draft hidden states into one
query per *target* query head (``Q^{m,j} = H^m W_j``) and attends to the target's cached keys/values,
grouped over the target's KV heads (GQA). Hugging Face caches keys **after** RoPE, so each draft query gets
the rotary embedding of its own position and ``q . k`` sees the same relative offset the target sees.

The token embedding and LM head are the target's, frozen and never stored in the drafter checkpoint: a
drafter is attached to its target at load time (``GlideForCausalLM.from_pretrained(path, target=target)``
or ``drafter.attach_target(target)``); the checkpoint records the target's fingerprint
(``hf_specdec.target.target_fingerprint``) and attaching another target is a clear error. ``target.generate(
**inputs, assistant_model=drafter)`` attaches the calling target automatically.

``cross_attention=False`` gives the vanilla drafter: the same class and layers without the cross-attention.

Optional reduced draft vocabulary (``draft_vocab_size``): see ``modeling/attached.py``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from hf_specdec.core.chain_drafting import DEFAULT_GAMMA
from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import CACHE_ARGUMENT, rotary_for_layer_type

from .attached import TargetAttachedMixin
from .glide_config import GlideConfig
from .glide_layers import GlideDecoderLayer
from .masks import blockwise_cross_mask, drafted_positions, dual_block_mask
from .target_layers import decoder_classes


class GlidePreTrainedModel(PreTrainedModel):
    config_class = GlideConfig
    base_model_prefix = "glide"
    _no_split_modules = ["GlideDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        """Linear layers drawn at random; norms keep their architecture's own initial values (ones for Llama's,
        zeros for Gemma's ``(1 + w)`` norms)."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


class GlideForCausalLM(TargetAttachedMixin, GlidePreTrainedModel, GenerationMixin):
    """The GLIDE drafter (or the vanilla drafter when ``config.cross_attention`` is False).

    ``forward`` takes the usual ``input_ids``/``position_ids``/``past_key_values`` (the drafter's own cache) plus
    ``target_past_key_values``: the target's cache (a ``transformers`` ``Cache``) as verified so far.
    """

    drafter_name = "GLIDE"
    fingerprint_field = "target_info"

    def __init__(self, config: GlideConfig):
        super().__init__(config)
        if len(config.target_layers) != config.num_hidden_layers:
            raise SpecDecError(
                f"GlideConfig.target_layers has {len(config.target_layers)} entries for "
                f"{config.num_hidden_layers} draft layers; give one target layer per draft layer"
            )
        layer_config = config.decoder_config()
        layer_class, _ = decoder_classes(layer_config, "GLIDE")
        self.layers = nn.ModuleList(
            GlideDecoderLayer(config, layer_config, layer_class, i) for i in range(config.num_hidden_layers)
        )
        self.norm = copy.deepcopy(self.layers[0].input_layernorm)  # the final norm: the same kind of norm
        self._init_draft_vocab()
        self.generation_config.num_assistant_tokens = DEFAULT_GAMMA  # §5.1
        self.generation_config.num_assistant_tokens_schedule = "constant"
        self.post_init()

    # ---------------------------------------------------------------- the target: see attached.py
    def _attach_extra(self, target: PreTrainedModel) -> None:
        """Also share the target's rotary embedding (that of its full-attention layers, the ones GLIDE reads)."""
        rotary = getattr(target.base_model, "rotary_emb", None)
        if rotary is None:
            raise SpecDecError(
                f"GLIDE needs a target with rotary position embeddings (`base_model.rotary_emb`); "
                f"{type(target).__name__} has none"
            )
        self.__dict__["_rotary"] = rotary_for_layer_type(rotary)

    # ---------------------------------------------------------------- warm start (CPU budget; see docs/glide.md)
    @torch.no_grad()
    def init_from_target(self, target: PreTrainedModel, init_layers: list[int] | None = None) -> None:
        """Copy weights from ``target``: draft layer m's self-attention/MLP/norms from target layer ``init_layers[m]``
        (default: the bottom layers), its cross-attention ``W_j`` from the target layer it reads (``W^O`` = 0), the final
        norm from the target's. Needs the default shapes (draft width and heads equal to the target's)."""
        base = target.base_model
        init_layers = init_layers or list(range(self.config.num_hidden_layers))
        for m, layer in enumerate(self.layers):
            src = base.layers[init_layers[m]]
            for name in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm") + (
                ("pre_feedforward_layernorm", "post_feedforward_layernorm") if layer.sandwich else ()
            ):
                getattr(layer, name).load_state_dict(getattr(src, name).state_dict())
            if hasattr(layer, "cross_attn"):
                read, cross = base.layers[self.config.target_layers[m]], layer.cross_attn
                rows = (
                    cross.q_proj.out_features
                )  # the query rows of the read layer (the first of a fused qkv)
                q_proj = getattr(read.self_attn, "q_proj", None) or read.self_attn.qkv_proj
                cross.q_proj.weight.copy_(q_proj.weight[:rows])
                if cross.q_proj.bias is not None:
                    cross.q_proj.bias.copy_(q_proj.bias[:rows])
                if hasattr(cross, "q_norm"):
                    cross.q_norm.load_state_dict(read.self_attn.q_norm.state_dict())
                # W^O starts at zero: the warm-started drafter begins as the vanilla one and learns to use the glimpse
                cross.o_proj.weight.zero_()
                layer.cross_layernorm.load_state_dict(read.input_layernorm.state_dict())
        self.norm.load_state_dict(base.norm.state_dict())

    # --------------------------------------------------------------- training protocol (trainers/drafters/trainer.py)
    def target_forward_kwargs(self) -> dict | None:
        """What the trainer asks of the frozen target: its KV cache (None for the vanilla drafter), in a new cache of
        full layers on every call: a sliding-window layer's own cache would keep only its window, where at inference
        GLIDE reads the verification loops' full layers (``core/sliding_window.verification_cache``)."""
        return {"use_cache": True, CACHE_ARGUMENT: DynamicCache()} if self.config.cross_attention else None

    def round_length(self) -> int:
        """L of the block-wise mask: ``DrafterTrainer`` reports the top-1 match at each block's first position apart
        (the draft that sees the freshest target cache)."""
        return self.config.block_size

    def features_from_target(self, target_outputs) -> dict[str, torch.Tensor]:
        """What GLIDE reads from a target pass: the cached keys / values of the target layers it cross-attends to
        (``keys.L`` / ``values.L``; what a feature store keeps)."""
        if not self.config.cross_attention:
            return {}
        features = {}
        for layer in sorted(set(self.config.target_layers)):
            keys, values = self._target_kv(target_outputs.past_key_values, layer)
            features[f"keys.{layer}"], features[f"values.{layer}"] = keys, values
        return features

    def context_from_features(self, features: dict, input_ids: torch.LongTensor) -> dict:
        """``hidden_states`` kwargs for a training batch: those keys / values seen through the block-wise mask."""
        if not self.config.cross_attention:
            return {}
        layers = sorted(set(self.config.target_layers))
        kv = {layer: (features[f"keys.{layer}"], features[f"values.{layer}"]) for layer in layers}
        mask = blockwise_cross_mask(input_ids.shape[1], self.config.block_size, input_ids.device)
        return {"target_past_key_values": kv, "cross_attention_mask": mask}

    def target_context(self, target_outputs, input_ids: torch.LongTensor) -> dict:
        """``hidden_states`` kwargs for a training batch: the target's cache seen through the block-wise mask."""
        return self.context_from_features(self.features_from_target(target_outputs), input_ids)

    def drafted_positions(self, input_ids: torch.LongTensor, context: dict) -> torch.Tensor:
        """Bool (n,): the positions whose input is, at inference, GLIDE's own previous draft (all but the first of
        each block of the block-wise mask; ``trainers/drafters/unrolled.py``)."""
        return drafted_positions(input_ids.shape[1], self.config.block_size, input_ids.device)

    def unrolled_inputs(self, input_ids: torch.LongTensor, fed_ids: torch.LongTensor, context: dict) -> dict:
        """``forward`` kwargs of a training step whose drafted inputs are ``fed_ids``
        (``trainers/drafters/unrolled.py``): one pass over ``[input_ids ; fed_ids]`` (both at positions 0..n-1). The
        self-attention mask lets a fed-back token see the data tokens before its round (at inference the drafter's
        own cache holds the verified tokens there) and the fed-back tokens of its round
        (``modeling/masks.dual_block_mask``, the same pattern); both halves see the target's cache through the
        block-wise mask. The fed-back half is the last n outputs."""
        b, n = input_ids.shape
        positions = torch.arange(n, device=input_ids.device)
        kwargs = dict(context)
        cross = kwargs.get("cross_attention_mask")
        if cross is not None:
            kwargs["cross_attention_mask"] = torch.cat([cross, cross], dim=-2)
        return {
            **kwargs,
            "input_ids": torch.cat([input_ids, fed_ids], dim=1),
            "position_ids": torch.cat([positions, positions])[None].expand(b, 2 * n),
            "self_attention_mask": dual_block_mask(n, self.config.block_size, device=input_ids.device),
        }

    # ---------------------------------------------------------------- forward
    def _target_kv(self, target_cache, layer: int):
        """(keys, values) of target layer ``layer`` (None if there are none yet)."""
        if target_cache is None or not self.config.cross_attention:
            return None
        if isinstance(target_cache, Cache):
            entry = target_cache.layers[layer]
            if not getattr(entry, "is_initialized", True) or entry.keys is None or entry.keys.numel() == 0:
                return None
            return entry.keys, entry.values
        return target_cache[layer]  # a (keys, values) sequence per target layer

    def hidden_states(
        self,
        input_ids: torch.LongTensor,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        target_past_key_values=None,
        cross_attention_mask: torch.Tensor | None = None,
        self_attention_mask: torch.Tensor | None = None,
        first_position: int | None = None,
    ) -> torch.Tensor:
        """Final-normed draft hidden states (B, n, d_D). ``cross_attention_mask``: bool (n, t) or (B, 1, n, t),
        True = may attend; default: a query at position p sees target positions k < p (at inference the target
        cache ends before the first draft position, so all of it is visible to the drafted positions).
        ``self_attention_mask``: bool (n, n), True = may attend, instead of the causal mask (training with fed-back
        inputs, ``unrolled_inputs``). ``first_position``: ``position_ids``'s smallest value when the caller knows it
        on the host (the default cross mask needs it; otherwise it is read from the device)."""
        target = self._require_target()
        b, n = input_ids.shape
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        device = input_ids.device
        if self_attention_mask is not None:
            self_mask = self_attention_mask.reshape(1, 1, n, -1)
        elif n > 1 and past > 0:  # new queries after a cached prefix: query i sees keys <= past + i
            self_mask = (
                torch.arange(past + n, device=device)[None, :]
                <= (past + torch.arange(n, device=device))[:, None]
            )
            self_mask = self_mask[None, None]
        else:
            self_mask = None  # one query, or causal from the start (sdpa's own causal mask)
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=device)[None].expand(b, n)
        h = target.get_input_embeddings()(input_ids).to(self.norm.weight.dtype)
        cos_sin = self.__dict__["_rotary"](h, position_ids)
        cos_sin = tuple(c.to(h.dtype) for c in cos_sin)
        first = first_position  # the first query position, read once if a default cross mask needs it
        for m, layer in enumerate(self.layers):
            kv = self._target_kv(target_past_key_values, self.config.target_layers[m])
            mask = cross_attention_mask
            if kv is not None and mask is None:
                t = kv[0].shape[-2]
                first = int(position_ids.min()) if first is None else first
                if first < t:  # only catch-up tokens inside the verified prefix need masking
                    mask = (
                        torch.arange(t, device=device)[None, None, None, :] < position_ids[:, None, :, None]
                    )
            elif mask is not None and mask.dim() == 2:
                mask = mask[None, None]
            h = layer(h, cos_sin, past_key_values, kv, mask, self_mask)
        return self.norm(h)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        target_past_key_values=None,
        cross_attention_mask: torch.Tensor | None = None,
        self_attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        draft_vocab_logits: bool = False,
        return_hidden_states: bool = False,
        **kwargs,
    ) -> CausalLMOutputWithPast | torch.Tensor:
        """Standard causal-LM forward. Logits are over the full vocabulary (``-inf`` outside a reduced draft
        vocabulary) unless ``draft_vocab_logits``; ``labels`` give the shifted cross-entropy loss. ``return_hidden_states``:
        return the final-normed hidden states alone."""
        if input_ids is None:
            raise SpecDecError("GlideForCausalLM.forward needs input_ids")
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        hidden = self.hidden_states(
            input_ids,
            position_ids,
            past_key_values if use_cache is not False else None,
            target_past_key_values,
            cross_attention_mask,
            self_attention_mask,
        )
        if return_hidden_states:  # the training pass (through forward, so that a DDP wrapper syncs gradients)
            return hidden
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.draft_logits(hidden)
        loss = None
        if labels is not None:
            shift = self.to_draft_ids(labels[:, 1:])
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), shift.flatten(), ignore_index=-100)
        if not draft_vocab_logits:
            logits = self.to_full_vocab(logits)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=past_key_values)

    # ---------------------------------------------------------------- hook for target.generate(assistant_model=...)
    def make_tree_proposer(
        self, target, generation_config=None, logits_processor=None, input_ids=None, model_kwargs=None, **_
    ):
        """Called by ``hf_specdec.core.assisted`` when this model is the ``assistant_model``: the chain as a tree
        proposer of the tree core (``hf_specdec.glide.cape.chain_proposer``), attached to ``target`` on ``start``."""
        from hf_specdec.glide.cape import chain_proposer

        return chain_proposer(self, target, logits_processor, input_ids, model_kwargs)
