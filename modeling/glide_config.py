"""``GlideConfig``: the configuration of a GLIDE drafter (GLIDE, arXiv:2402.02082, §4.1), built for a target with
``GlideConfig.for_target(target)``; the model is ``modeling/glide.py``."""

from __future__ import annotations

from transformers import PretrainedConfig, PreTrainedModel

from hf_specdec.errors import SpecDecError
from hf_specdec.target import target_fingerprint

from .target_layers import build_layer_config, layer_config_dict

# The drafter's own sizes, written into ``layer_config`` so that the two never disagree.
_DRAFT_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


class GlideConfig(PretrainedConfig):
    """Configuration of a GLIDE drafter. Build one for a target with ``GlideConfig.for_target(target)``.

    Draft side: ``layer_config``, the target's text config (``modeling/target_layers.py``): the drafter's layers
    are layers of the target's architecture, with the sizes below. ``hidden_size`` (d_D, equal to the target's
    hidden size because the embedding and LM head are shared), ``num_hidden_layers`` (N_D), self-attention
    heads, ``intermediate_size``. A config written before ``layer_config`` existed describes a Llama layer (what
    those drafters were built of), from the fields ``hidden_act``, ``rms_norm_eps`` and ``mlp_bias``.
    Target side (what the cross-attention reads): ``target_num_hidden_layers`` (N_T),
    ``target_num_attention_heads`` (h), ``target_num_key_value_heads``, ``target_head_dim`` (d_k),
    ``target_layers`` (one target layer per draft layer) and ``target_info`` (the target's fingerprint).
    ``cross_attention=False`` is the vanilla drafter. ``block_size`` is L of the block-wise training mask.
    """

    model_type = "hf_specdec_glide"  # namespaced: no future transformers model can take the name

    def __init__(
        self,
        vocab_size: int = 49152,
        hidden_size: int = 576,
        intermediate_size: int = 1536,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 9,
        num_key_value_heads: int = 3,
        head_dim: int = 64,
        hidden_act: str = "silu",
        rms_norm_eps: float = 1e-5,
        mlp_bias: bool = False,
        cross_attention: bool = True,
        target_layers: list[int] | None = None,
        target_num_hidden_layers: int = 30,
        target_num_attention_heads: int = 9,
        target_num_key_value_heads: int = 3,
        target_head_dim: int = 64,
        block_size: int = 5,
        draft_vocab_size: int | None = None,
        target_info: dict | None = None,
        initializer_range: float = 0.02,
        layer_config: dict | None = None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.rms_norm_eps = rms_norm_eps
        self.mlp_bias = mlp_bias
        self.cross_attention = cross_attention
        if target_layers is None:  # §4.1: draft layer m attends to target layer N_T - N_D + m
            target_layers = [
                target_num_hidden_layers - num_hidden_layers + m for m in range(num_hidden_layers)
            ]
        self.target_layers = list(target_layers)
        self.target_num_hidden_layers = target_num_hidden_layers
        self.target_num_attention_heads = target_num_attention_heads
        self.target_num_key_value_heads = target_num_key_value_heads
        self.target_head_dim = target_head_dim
        self.block_size = block_size
        self.draft_vocab_size = draft_vocab_size
        self.target_info = target_info or {}
        self.initializer_range = initializer_range
        self.layer_config = None
        if layer_config:
            self.layer_config = dict(layer_config)
            self.layer_config.update({key: getattr(self, key) for key in _DRAFT_SIZES})
            if self.layer_config.get("layer_types") is not None:
                self.layer_config["layer_types"] = ["full_attention"] * num_hidden_layers
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    def decoder_config(self) -> PretrainedConfig:
        """The transformers config the draft layers are built from (``modeling/target_layers.py``)."""
        values = self.layer_config
        if not values:  # written before layer_config: a Llama layer of these sizes
            values = {key: getattr(self, key) for key in _DRAFT_SIZES}
            values.update(
                model_type="llama",
                vocab_size=self.vocab_size,
                hidden_act=self.hidden_act,
                rms_norm_eps=self.rms_norm_eps,
                mlp_bias=self.mlp_bias,
                attention_bias=False,
            )
        return build_layer_config(values, "GLIDE")

    @classmethod
    def for_target(
        cls,
        target: PreTrainedModel,
        num_hidden_layers: int = 1,
        cross_attention: bool = True,
        target_layers: list[int] | None = None,
        draft_vocab_size: int | None = None,
        **overrides,
    ) -> GlideConfig:
        """A drafter config shaped after ``target``: layers of its architecture, reading by default the top
        ``num_hidden_layers`` of its full-attention layers (§5.4: the top layers; a sliding-window layer's cache
        holds only its window, so it is never read)."""
        t = target.config.get_text_config()
        heads = t.num_attention_heads
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
        kv_heads = getattr(t, "num_key_value_heads", None) or heads
        if getattr(t, "attn_logit_softcapping", None):
            raise SpecDecError(
                f"GLIDE cannot read a {t.model_type} target: its attention logits are soft-capped "
                "(attn_logit_softcapping), which the cross-attention does not reproduce; use EDD or PLD+ instead"
            )
        windowed = [
            i for i, kind in enumerate(getattr(t, "layer_types", None) or []) if kind != "full_attention"
        ]
        full = [i for i in range(t.num_hidden_layers) if i not in windowed]
        if target_layers is None:
            if len(full) < num_hidden_layers:
                raise SpecDecError(
                    f"GLIDE needs {num_hidden_layers} full-attention layers of the target to read; "
                    f"{t.model_type} has {len(full)}"
                )
            target_layers = full[len(full) - num_hidden_layers :]
        sliding = [layer for layer in target_layers if layer in windowed]
        if sliding:
            raise SpecDecError(
                f"GLIDE target_layers {sliding} are sliding-window layers of this {t.model_type} target (their "
                f"cache keeps only the window); choose full-attention layers: {full}"
            )
        values = dict(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            intermediate_size=getattr(t, "intermediate_size", 4 * t.hidden_size),
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            hidden_act=getattr(t, "hidden_act", "silu"),
            rms_norm_eps=getattr(t, "rms_norm_eps", 1e-5),
            cross_attention=cross_attention,
            target_layers=target_layers,
            target_num_hidden_layers=t.num_hidden_layers,
            target_num_attention_heads=heads,
            target_num_key_value_heads=kv_heads,
            target_head_dim=head_dim,
            draft_vocab_size=draft_vocab_size,
            target_info=target_fingerprint(target),
            layer_config=layer_config_dict(target, num_hidden_layers),
            bos_token_id=t.bos_token_id,
            eos_token_id=t.eos_token_id,
            pad_token_id=t.pad_token_id,
        )
        values.update(overrides)
        return cls(**values)
