"""EDD, the Effective Draft Decoder (EDD, ACL 2025, §3.1, Fig. 2, App. B).

EDD is **one decoder layer of the target's own architecture** (built with ``AutoModel.from_config`` from the
target's config with ``num_hidden_layers=1`` and full attention, ``modeling/target_layers.py``: a Llama target
gets a Llama layer, a Gemma 3 target a Gemma 3 layer). The target acts as an *encoder*: its hidden states
``H = (h_0, ..., h_{p-1})`` of the verified tokens taken from an intermediate layer (App. B: the fourth-to-last;
``EddConfig.encoder_layer``) are fed to EDD as a **soft prompt** -- as input embeddings, ahead of the draft tokens,
at the same positions as the tokens they encode -- and EDD decodes the draft autoregressively after them::

    EDD input:  h_0  h_1 ... h_{p-1} | x_p   d_{p+1}  d_{p+2} ...
    positions:  0    1   ... p-1     | p     p+1      p+2
    outputs:                         | ->d_{p+1} ->d_{p+2} ...

``x_p`` is the last committed token (the target's bonus token, not yet encoded by the target). At inference
the soft-prompt part of EDD's own KV cache grows only with *verified* tokens; the draft part is dropped after
every verification, exactly what the dual-block training mask (Fig. 3a, eq. 3; ``modeling/masks.py``)
simulates: a token of block j sees the hidden states of blocks < j and the tokens of its own block only.

Embedding and LM head: §3.1 *initialises* them from the target. Here they **are** the target's (shared,
frozen, not stored in the checkpoint): training them on a CPU budget would cost 2 x 28M parameters of
optimizer state for little gain and make them drift from the target's. The head can be restricted to a reduced
draft vocabulary (``set_draft_vocab``, ``modeling/attached.py``). A drafter is attached to its target at
load time (``EddForCausalLM.from_pretrained(path, target=target)``, ``drafter.attach_target(target)``, or
automatically by ``target.generate(**inputs, assistant_model=drafter)``); the checkpoint records the target's
fingerprint and attaching another target is a clear error.

``soft_prompt=False`` is the ablation "w/o encoding result" (Table 3): the same layer decodes the tokens alone,
a vanilla one-layer draft model (VDM) sharing the target's embedding and head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from hf_specdec.core.chain_drafting import DEFAULT_GAMMA
from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import CACHE_ARGUMENT
from hf_specdec.target import target_fingerprint

from .attached import TargetAttachedMixin
from .masks import drafted_positions, dual_block_mask
from .target_layers import build_layer_config, layer_config_dict


class EddConfig(PretrainedConfig):
    """Configuration of an EDD drafter; build one for a target with ``EddConfig.for_target(target)``.

    - ``layer_config``: the target's text config as a dict, with ``num_hidden_layers=1`` (the EDD layer).
    - ``encoder_layer``: index into the target's ``output_hidden_states`` tuple (0 = embeddings, i = output of
      layer i) whose states are the soft prompt. Default ``N - 3`` = ``hidden_states[-4]``, the output of the
      fourth-to-last layer (App. B; the paper's "28th" of LLaMA2-7B's 32 layers counted from 0); targets with
      fewer than 4 layers use layer 1.
    - ``soft_prompt``: False for the "w/o encoding result" ablation.
    - ``block_min`` / ``block_max``: block lengths L drawn uniformly per training step (App. B: 5-10; equal
      values give the "w/o random division length" ablation); ``eval_block_length`` for validation.
    - ``loss``: ``"kl"`` (eq. 4, the paper's) or ``"ce"`` (the "w/o KL divergence" ablation).
    - ``target_info``: the fingerprint of the target it belongs to (``target`` in checkpoints written before the
      model type was namespaced; still read).
    - ``draft_vocab_size``: size of the optional reduced draft vocabulary (``modeling/attached.py``).
    - ``confidence_temperature``: ``T`` of the confidences the candidate trees read, ``softmax(logits / T)``
      (PCT assumes they are calibrated, §3.2); fitted on validation data after training
      (``trainers/drafters/calibration.py``). 1.0 = the raw softmax. The drafted tokens' ranking does not depend
      on it.
    """

    model_type = "hf_specdec_edd"  # namespaced: no future transformers model can take the name

    def __init__(
        self,
        layer_config: dict | None = None,
        encoder_layer: int | None = None,
        target_num_hidden_layers: int = 30,
        soft_prompt: bool = True,
        block_min: int = 5,
        block_max: int = 10,
        eval_block_length: int = 5,
        loss: str = "kl",
        target_info: dict | None = None,
        draft_vocab_size: int | None = None,
        confidence_temperature: float = 1.0,
        **kwargs,
    ):
        if not confidence_temperature > 0:
            raise SpecDecError(
                f"EddConfig.confidence_temperature must be > 0, got {confidence_temperature!r}"
            )
        self.confidence_temperature = float(confidence_temperature)
        self.layer_config = dict(layer_config or {})
        self.target_num_hidden_layers = target_num_hidden_layers
        default = max(target_num_hidden_layers - 3, min(1, target_num_hidden_layers))
        self.encoder_layer = default if encoder_layer is None else int(encoder_layer)
        self.soft_prompt = soft_prompt
        self.block_min = block_min
        self.block_max = block_max
        self.eval_block_length = eval_block_length
        if loss not in ("kl", "ce"):
            raise SpecDecError(f"EddConfig.loss must be 'kl' or 'ce', got {loss!r}")
        self.loss = loss
        legacy = kwargs.pop("target", None)  # the field's name before it was target_info
        if target_info is None and isinstance(legacy, dict):
            target_info = legacy
        self.target_info = target_info or {}
        self.draft_vocab_size = draft_vocab_size
        for key in ("vocab_size", "hidden_size", "bos_token_id", "eos_token_id", "pad_token_id"):
            if key in self.layer_config:
                kwargs.setdefault(key, self.layer_config[key])
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.vocab_size = self.layer_config.get("vocab_size", kwargs.get("vocab_size"))
        self.hidden_size = self.layer_config.get("hidden_size", kwargs.get("hidden_size"))

    @classmethod
    def for_target(
        cls, target: PreTrainedModel, encoder_layer: int | None = None, soft_prompt: bool = True, **overrides
    ) -> EddConfig:
        """A config whose decoder layer has the architecture and sizes of ``target``'s layers."""
        n = target.config.get_text_config().num_hidden_layers
        if encoder_layer is not None and not 0 <= encoder_layer <= n:
            raise SpecDecError(
                f"encoder_layer must be in [0, {n}] for a {n}-layer target, got {encoder_layer}"
            )
        decoder = layer_config_dict(target, 1)
        return cls(
            layer_config=decoder,
            encoder_layer=encoder_layer,
            target_num_hidden_layers=n,
            soft_prompt=soft_prompt,
            target_info=target_fingerprint(target),
            **overrides,
        )

    def decoder_config(self) -> PretrainedConfig:
        """The transformers config of the EDD layer (``modeling/target_layers.py``)."""
        return build_layer_config(self.layer_config, "EDD")


class EddPreTrainedModel(PreTrainedModel):
    config_class = EddConfig
    base_model_prefix = "edd"
    _supports_sdpa = True


class EddForCausalLM(TargetAttachedMixin, EddPreTrainedModel, GenerationMixin):
    """The EDD drafter: ``decoder`` is a one-layer base model of the target's architecture (its own token
    embedding removed: tokens are embedded with the target's). See the module docstring."""

    drafter_name = "EDD"
    fingerprint_field = "target_info"

    def __init__(self, config: EddConfig):
        super().__init__(config)
        # at the dtype this model is being built in (``from_pretrained(..., dtype=)`` sets it): ``from_config`` would
        # otherwise build the layer at the dtype recorded in ``layer_config`` (the target's when the drafter was made)
        self.decoder = AutoModel.from_config(config.decoder_config(), dtype=torch.get_default_dtype())
        if hasattr(self.decoder, "embed_tokens"):
            self.decoder.embed_tokens = None  # the target's embedding is used (never stored here)
        self._init_draft_vocab()
        self.generation_config.num_assistant_tokens = DEFAULT_GAMMA  # Table 1: "a draft sequence of length 5"
        self.generation_config.num_assistant_tokens_schedule = "constant"
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Linear layers drawn at random; norms keep their architecture's own initial values (ones for Llama's,
        zeros for Gemma's ``(1 + w)`` norms)."""
        std = getattr(self.config.decoder_config(), "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ---------------------------------------------------------------- the target: see attached.py
    def set_input_embeddings(self, value) -> None:  # the embedding belongs to the target
        pass

    @property
    def dtype(self) -> torch.dtype:
        return next(self.decoder.parameters()).dtype

    @torch.no_grad()
    def init_from_target(self, target: PreTrainedModel, layer: int = 0) -> None:
        """Warm start (CPU budget, see docs/edd-pct.md): copy target layer ``layer`` and the final norm.

        Layer 0 is the default because EDD's token stream starts from raw embeddings as the target's layer 0 does;
        measured on one validation block of SmolLM2-135M, top-1 agreement with the target before training was
        0.039 from layer 0, 0.0 from the layer that reads the soft prompt (27) and 0.008 from random weights."""
        base = target.base_model
        self.decoder.layers[0].load_state_dict(base.layers[layer].state_dict())
        if hasattr(base, "norm") and hasattr(self.decoder, "norm"):
            self.decoder.norm.load_state_dict(base.norm.state_dict())

    # ---------------------------------------------------------------- building blocks
    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        return self._require_target().get_input_embeddings()(input_ids).to(self.dtype)

    def decode(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.LongTensor,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One pass of the EDD layer (+ final norm) over ``inputs_embeds`` (soft-prompt vectors and/or token
        embeddings). ``attention_mask``: None (causal after the cache) or a 4D additive float mask."""
        out = self.decoder(
            inputs_embeds=inputs_embeds.to(self.dtype),
            position_ids=position_ids,
            **{CACHE_ARGUMENT: past_key_values},
            attention_mask=attention_mask,
            use_cache=past_key_values is not None,
        )
        return out.last_hidden_state

    # --------------------------------------------------------------- training protocol (trainers/drafters/trainer.py)
    def target_forward_kwargs(self) -> dict | None:
        """What the trainer asks of the frozen target: all hidden states (we keep ``encoder_layer``'s)."""
        return {"output_hidden_states": True} if self.config.soft_prompt else None

    def training_block_length(self) -> int:
        """L for this step: uniform in [block_min, block_max] while training (App. B), fixed for validation."""
        if not self.training:
            return self.config.eval_block_length
        lo, hi = self.config.block_min, self.config.block_max
        return int(torch.randint(lo, hi + 1, (), device="cpu").item())  # a host-side draw, read back at once

    def round_length(self) -> int:
        """Draft positions per round in validation (the eval block length): ``DrafterTrainer`` reports the top-1
        match at each round's first position apart."""
        return self.config.eval_block_length

    def features_from_target(self, target_outputs) -> dict[str, torch.Tensor]:
        """What EDD reads from a target pass: the hidden states of ``encoder_layer`` (what a feature store keeps)."""
        if not self.config.soft_prompt:
            return {}
        return {"soft_prompt": target_outputs.hidden_states[self.config.encoder_layer]}

    def context_from_features(self, features: dict, input_ids: torch.LongTensor) -> dict:
        """``hidden_states`` kwargs from those features: the soft prompt and this step's block length L."""
        if not self.config.soft_prompt:
            return {}
        return {"soft_prompt": features["soft_prompt"], "block_length": self.training_block_length()}

    def target_context(self, target_outputs, input_ids: torch.LongTensor) -> dict:
        return self.context_from_features(self.features_from_target(target_outputs), input_ids)

    def drafted_positions(self, input_ids: torch.LongTensor, context: dict) -> torch.Tensor:
        """Bool (n,): the positions whose input is, at inference, EDD's own previous draft: all but the first token of
        each block of this step's dual-block mask (``trainers/drafters/unrolled.py``). The ablation without soft
        prompt trains a causal pass with no rounds: an error."""
        if "block_length" not in context:
            raise SpecDecError(
                "train as you draft (ttt_steps > 1) needs EDD's drafting rounds, the blocks of the dual-block mask; "
                "the ablation without soft prompt (soft_prompt=False) trains a plain causal pass without them"
            )
        return drafted_positions(input_ids.shape[1], context["block_length"], input_ids.device)

    def unrolled_inputs(self, input_ids: torch.LongTensor, fed_ids: torch.LongTensor, context: dict) -> dict:
        """``forward`` kwargs of a training step whose drafted inputs are ``fed_ids``
        (``trainers/drafters/unrolled.py``): the same pass over them, with the same soft prompt and block length.
        Under the dual-block mask a token sees only its own block's tokens (earlier blocks reach it as soft prompt),
        exactly as a drafting round at inference."""
        return {**context, "input_ids": fed_ids}

    def hidden_states(
        self,
        input_ids: torch.LongTensor,
        soft_prompt: torch.Tensor | None = None,
        block_length: int | None = None,
    ) -> torch.Tensor:
        """Teacher-forced training pass: (B, n, D) outputs at the token positions (output j predicts token j+1).

        With a soft prompt ``H`` (B, n, D), EDD runs over ``[H ; E(tokens)]`` (2n positions, both halves at
        positions 0..n-1) under the dual-block mask of length ``block_length`` (Fig. 3a). Without one (the
        ablation) it is a causal pass over the tokens.
        """
        b, n = input_ids.shape
        tokens = self.embed(input_ids)
        positions = torch.arange(n, device=input_ids.device)[None].expand(b, n)
        if soft_prompt is None or not self.config.soft_prompt:
            return self.decode(tokens, positions)
        mask = dual_block_mask(n, block_length or self.config.eval_block_length, device=input_ids.device)
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min
        )
        x = torch.cat([soft_prompt.to(self.dtype), tokens], dim=1)
        out = self.decode(x, torch.cat([positions, positions], dim=1), attention_mask=additive[None, None])
        return out[:, n:]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        soft_prompt: torch.Tensor | None = None,
        block_length: int | None = None,
        labels: torch.LongTensor | None = None,
        return_hidden_states: bool = False,
        **kwargs,
    ) -> CausalLMOutputWithPast | torch.Tensor:
        """Teacher-forced forward (see ``hidden_states``); ``labels`` give the shifted cross-entropy loss. Logits are
        over the full vocabulary (``-inf`` outside a reduced draft vocabulary). ``return_hidden_states``: return
        ``hidden_states(...)`` alone (the training pass; through ``forward`` so that a DDP wrapper syncs gradients).
        Decoding does not go through here: see ``hf_specdec.edd``."""
        if input_ids is None:
            raise SpecDecError("EddForCausalLM.forward needs input_ids")
        if return_hidden_states:
            return self.hidden_states(input_ids, soft_prompt, block_length)
        logits = self.draft_logits(self.hidden_states(input_ids, soft_prompt, block_length))
        loss = None
        if labels is not None:
            gold = self.to_draft_ids(labels[:, 1:])
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), gold.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=self.to_full_vocab(logits))

    # ---------------------------------------------------------------- target.generate(assistant_model=edd)
    def make_tree_proposer(self, target, generation_config=None, logits_processor=None, **_):
        """``hf_specdec.core.assisted`` calls it when this model is the ``assistant_model``: the chain of up to gamma
        top-1 drafts for the tree core, sized by its cost on this machine (PCT of width 1 on the measured costs)
        while ``chain_cost`` is on, else always gamma tokens (``EddTreeProposer`` builder ``"chain"``);
        deterministic drafts, which the tree core verifies losslessly greedily and with sampling (one-hot q)."""
        from hf_specdec.core.chain_drafting import chain_length
        from hf_specdec.edd.tree_proposer import EddTreeProposer

        gamma = chain_length(self)  # attached to target on start
        if self.chain_cost:
            return EddTreeProposer(self, "pct", width=1, depth=gamma)
        return EddTreeProposer(self, "chain", depth=gamma)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.decoder.config)
