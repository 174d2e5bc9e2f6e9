"""GLIDE's decoder layer (glide-cape.txt §4.1): self-attention over the draft's own tokens, then cross-attention into
the target's KV cache, then feed-forward. The model around it is ``modeling/glide.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache

from hf_specdec.hf_compat import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb

from .glide_config import GlideConfig


class GlideSelfAttention(nn.Module):
    """Causal self-attention over the draft's own tokens (RoPE, GQA, the drafter's own KV cache)."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos_sin, cache: Cache | None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``mask``: an explicit bool mask (True = may attend) over the keys, for the training pass with fed-back
        inputs (``trainers/unrolled.py``); None: causal after the cache."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
        past = 0
        if cache is not None:
            past = cache.get_seq_length(self.layer_idx)
            k, v = cache.update(k, v, self.layer_idx)
        if mask is not None:
            causal = False
        elif n == 1:
            mask, causal = None, False
        elif past == 0:
            mask, causal = None, True
        else:  # new queries after a cached prefix: query i sees keys <= past + i
            mask = (
                torch.arange(past + n, device=x.device)[None, :]
                <= (past + torch.arange(n, device=x.device))[:, None]
            )
            causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class GlideCrossAttention(nn.Module):
    """Cross-attention from draft queries into the target's cached keys/values (§4.1, ``MultiHead(Q^m, K^l, V^l)``).

    ``q_proj`` is the h projections ``W_j`` (d_D -> d_k each, one per target query head); queries are grouped over
    the target's KV heads (GQA) and rotated with the RoPE of their own positions. ``o_proj`` is ``W^O``.
    """

    def __init__(self, config: GlideConfig):
        super().__init__()
        self.heads, self.head_dim = config.target_num_attention_heads, config.target_head_dim
        self.kv_heads = config.target_num_key_value_heads
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos_sin, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``keys``/``values``: (B, target KV heads, t, d_k); ``mask``: bool (B or 1, 1, n, t), True = may attend."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        cos, sin = cos_sin
        q = q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)
        visible = None
        if mask is not None:
            # A query with no visible target key gets no cross-attention signal. It attends to key 0 inside the
            # kernel so that its softmax stays finite (a fully masked row is NaN in some SDPA kernels, and NaN
            # would reach every gradient in the backward pass), and its output is zeroed below.
            visible = mask.any(-1, keepdim=True)
            first = torch.arange(mask.shape[-1], device=mask.device) == 0
            mask = mask | (~visible & first)
        out = F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, enable_gqa=True
        )
        if visible is not None:
            out = torch.where(visible, out, out.new_zeros(()))
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GlideDecoderLayer(nn.Module):
    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = GlideSelfAttention(config, layer_idx)
        if config.cross_attention:
            self.cross_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.cross_attn = GlideCrossAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, h, cos_sin, cache, target_kv, cross_mask, self_mask=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos_sin, cache, self_mask)
        if target_kv is not None and hasattr(self, "cross_attn"):
            h = h + self.cross_attn(self.cross_layernorm(h), cos_sin, *target_kv, cross_mask)
        return h + self.mlp(self.post_attention_layernorm(h))
