"""GLIDE's decoder layer (GLIDE, arXiv:2402.02082, §4.1): self-attention over the draft's own tokens, then cross-attention into
the target's KV cache, then feed-forward. The model around it is ``modeling/glide.py``.

The self-attention, feed-forward and norms are those of a layer of the target's own architecture
(``modeling/target_layers.py``): its attention class (q/k norms, biases, query scaling, fused projections), its
MLP and its norm convention, pre-norm (Llama, Mistral, Qwen2/3, Phi-3) or Gemma's sandwich norms around both
blocks. The cross-attention follows the conventions of the target layer it reads: the same query bias, query
norm and scaling, rotary embedding over the same dimensions.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import SANDWICH_NORMS, attention_module_call, decoder_layer_parts

from .glide_config import GlideConfig


class GlideCrossAttention(nn.Module):
    """Cross-attention from draft queries into the target's cached keys/values (§4.1, ``MultiHead(Q^m, K^l, V^l)``).

    ``q_proj`` is the h projections ``W_j`` (d_D -> d_k each, one per target query head); queries are grouped over
    the target's KV heads (GQA), normed where the target norms its queries, and rotated with the RoPE of their own
    positions (Hugging Face caches keys after RoPE). ``o_proj`` is ``W^O``. ``attention`` is the drafter's
    self-attention module, of the target's attention class: its query norm, bias and scaling are copied.
    """

    def __init__(self, config: GlideConfig, layer_config: PretrainedConfig, attention: nn.Module):
        super().__init__()
        self.heads, self.head_dim = config.target_num_attention_heads, config.target_head_dim
        self.kv_heads = config.target_num_key_value_heads
        q_proj = getattr(attention, "q_proj", None)
        bias = q_proj is not None and q_proj.bias is not None
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)
        q_norm = getattr(attention, "q_norm", None)
        same_heads = getattr(attention, "head_dim", self.head_dim) == self.head_dim
        if q_norm is not None:
            if not same_heads:
                raise SpecDecError(
                    f"GLIDE on a {layer_config.model_type} target needs the drafter's head_dim equal to the "
                    f"target's ({self.head_dim}): the cross-attention norms its queries like the target"
                )
            self.q_norm = copy.deepcopy(q_norm)
        self.scaling = float(attention.scaling) if same_heads else self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, cos_sin, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``keys``/``values``: (B, target KV heads, t, d_k); ``mask``: bool (B or 1, 1, n, t), True = may attend."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q = self.q_norm(q)
        q = _rotate(q, *cos_sin)
        visible = None
        if mask is not None:
            # A query with no visible target key gets no cross-attention signal. It attends to key 0 inside the
            # kernel so that its softmax stays finite (a fully masked row is NaN in some SDPA kernels, and NaN
            # would reach every gradient in the backward pass), and its output is zeroed below.
            visible = mask.any(-1, keepdim=True)
            first = torch.arange(mask.shape[-1], device=mask.device) == 0
            mask = mask | (~visible & first)
        out = F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=self.scaling, enable_gqa=True
        )
        if visible is not None:
            out = torch.where(visible, out, out.new_zeros(()))
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def _rotate(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first ``cos.shape[-1]`` dimensions of each head (all of them but for partial rotary
    embeddings), the convention of the target's ``apply_rotary_pos_emb``."""
    r = cos.shape[-1]
    rot, rest = q[..., :r], q[..., r:]
    half = r // 2
    rot = rot * cos.unsqueeze(1) + torch.cat((-rot[..., half:], rot[..., :half]), dim=-1) * sin.unsqueeze(1)
    return torch.cat((rot, rest), dim=-1) if rest.shape[-1] else rot


class GlideDecoderLayer(nn.Module):
    """Self-attention -> cross-attention -> feed-forward, each a residual block; the self-attention, MLP and norms
    are taken from ``layer_class(layer_config, layer_idx)``, a decoder layer of the target's architecture."""

    def __init__(
        self, config: GlideConfig, layer_config: PretrainedConfig, layer_class: type, layer_idx: int
    ):
        super().__init__()
        parts = decoder_layer_parts(layer_class(layer_config, layer_idx), "GLIDE")
        self.sandwich = SANDWICH_NORMS[0] in parts
        for name, module in parts.items():
            setattr(self, name, module)
        if config.cross_attention:
            self.cross_layernorm = copy.deepcopy(parts["input_layernorm"])
            self.cross_attn = GlideCrossAttention(config, layer_config, parts["self_attn"])

    def forward(self, h, cos_sin, cache, target_kv, cross_mask, self_mask=None) -> torch.Tensor:
        """``self_mask``: bool (1, 1, n, keys) or None (causal, sdpa's own); ``cache``: the drafter's own cache."""
        a = attention_module_call(self.self_attn, self.input_layernorm(h), cos_sin, self_mask, cache)
        h = h + (self.post_attention_layernorm(a) if self.sandwich else a)
        if target_kv is not None and hasattr(self, "cross_attn"):
            h = h + self.cross_attn(self.cross_layernorm(h), cos_sin, *target_kv, cross_mask)
        if self.sandwich:
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        return h + self.mlp(self.post_attention_layernorm(h))
