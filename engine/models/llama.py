"""Llama-family decoder (Llama, Mistral, Qwen2) in our own code, reading K/V from the paged cache.

Module names mirror Hugging Face's so a checkpoint's state dict loads as is. Numerics follow
transformers' implementation (RMSNorm in fp32, rotate-half RoPE) so greedy outputs match.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from engine.models.attention_metadata import AttentionMetadata, paged_attention
from engine.models.spec import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed in fp32 and cast last, as transformers does. The frequencies are
    not a buffer on purpose: ``model.to(bfloat16)`` would round them (0.4 rad off at 1k tokens)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
            self._inv_freq[device] = (1.0 / (self.theta ** exponents)).to(device)
        return self._inv_freq[device]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[:, None] * self.inv_freq(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.scale = spec.head_dim ** -0.5
        bias = spec.attention_bias
        self.q_proj = nn.Linear(spec.hidden_size, spec.num_heads * spec.head_dim, bias=bias)
        self.k_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=bias)
        self.v_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden_size,
                                bias=spec.o_proj_bias)

        self.qkv: tuple | None = None       # (weight, bias) once fuse() ran

    def fuse(self) -> None:
        """One [q; k; v] matmul instead of three (fewer launches per layer). The three
        parameters become views of the fused weight, so no memory is duplicated."""
        parts = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([m.weight.data for m in parts])
        bias = torch.cat([m.bias.data for m in parts]) if self.q_proj.bias is not None else None
        offsets = [0]
        for m in parts:
            offsets.append(offsets[-1] + m.weight.shape[0])
        for m, a, b in zip(parts, offsets, offsets[1:]):
            m.weight = nn.Parameter(weight[a:b], requires_grad=False)
            if bias is not None:
                m.bias = nn.Parameter(bias[a:b], requires_grad=False)
        self.qkv = (weight, bias, offsets[1:3])

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata, ops):
        t = x.shape[0]
        if self.qkv is not None:
            weight, bias, (nq, nqk) = self.qkv
            y = F.linear(x, weight, bias)
            q, k, v = y[:, :nq], y[:, nq:nqk], y[:, nqk:]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = paged_attention(q, k, v, k_cache, v_cache, meta, ops, self.scale)
        return self.o_proj(o.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None

    def fuse(self) -> None:
        """One [gate; up] matmul instead of two; the parameters become views of it."""
        weight = torch.cat([self.gate_proj.weight.data, self.up_proj.weight.data])
        n = self.gate_proj.weight.shape[0]
        self.gate_proj.weight = nn.Parameter(weight[:n], requires_grad=False)
        self.up_proj.weight = nn.Parameter(weight[n:], requires_grad=False)
        self.gate_up = weight

    def forward(self, x):
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, meta, ops):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, meta, ops)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta)


class LlamaForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.model = Backbone(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, ops) -> torch.Tensor:
        """Hidden states [T, hidden] of the computed tokens; K/V stored into ``kv_cache``
        ([layers, 2, blocks, block_size, kv_heads, head_dim])."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary(positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, kv_cache[i, 0], kv_cache[i, 1], meta, ops)
        return self.model.norm(x)

    def fuse_projections(self) -> None:
        """After the weights are loaded: fused q/k/v and gate/up matmuls in every layer."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
