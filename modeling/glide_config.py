"""``GlideConfig``: the configuration of a GLIDE drafter (glide-cape.txt §4.1), built for a target with
``GlideConfig.for_target(target)``; the model is ``modeling/glide.py``."""

from __future__ import annotations

from transformers import PretrainedConfig, PreTrainedModel

from hf_specdec.target import target_fingerprint


class GlideConfig(PretrainedConfig):
    """Configuration of a GLIDE drafter. Build one for a target with ``GlideConfig.for_target(target)``.

    Draft side: ``hidden_size`` (d_D, equal to the target's hidden size because the embedding and LM head are
    shared), ``num_hidden_layers`` (N_D), self-attention heads, ``intermediate_size``.
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
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

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
        """A drafter config shaped after ``target`` (a Llama-like model with rotary embeddings)."""
        t = target.config.get_text_config()
        heads = t.num_attention_heads
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
        kv_heads = getattr(t, "num_key_value_heads", None) or heads
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
            bos_token_id=t.bos_token_id,
            eos_token_id=t.eos_token_id,
            pad_token_id=t.pad_token_id,
        )
        values.update(overrides)
        return cls(**values)
