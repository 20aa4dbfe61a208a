"""GPT-2 in our own code, reading K/V from the paged cache.

Same interface as engine/models/llama.py: ``forward(input_ids, positions, kv_cache, meta, ops)``
returns the final hidden states of the computed tokens; ``compute_logits(hidden)``.

What differs from the Llama family: learned absolute position embeddings (``wpe``) instead of
RoPE, LayerNorm (with bias) instead of RMSNorm, plain multi-head attention (kv heads = heads),
one fused ``c_attn`` projection for q, k, v, a GELU MLP, and the lm_head tied to ``wte``.
Hugging Face stores GPT-2's linear layers as ``Conv1D``: the weight is ``[in, out]`` (the
transpose of ``nn.Linear``) and the layer computes ``x @ W + b``; module names mirror HF's
(``transformer.h.0.attn.c_attn.weight``) so a checkpoint's state dict loads as is.
"""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from engine.models.attention_metadata import AttentionMetadata, paged_attention
from engine.models.spec import ModelSpec


class Conv1D(nn.Module):
    """HF's GPT-2 linear layer: weight [in_features, out_features], y = x @ W + b."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:-1], self.weight.shape[1])
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """OpenAI GPT's tanh approximation of GELU (transformers' NewGELUActivation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


_ACTIVATIONS = {
    "gelu_new": gelu_new,
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
}


class GPT2Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int):
        super().__init__()
        self.num_heads = spec.num_heads
        self.head_dim = spec.head_dim
        self.hidden = spec.hidden_size
        self.scale = spec.scale / (layer_idx + 1 if spec.attn_scale_inverse_layer else 1)
        self.c_attn = Conv1D(spec.hidden_size, 3 * spec.hidden_size)
        self.c_proj = Conv1D(spec.hidden_size, spec.hidden_size)

    def forward(self, x, k_cache, v_cache, meta: AttentionMetadata, ops):
        t = x.shape[0]
        q, k, v = self.c_attn(x).split(self.hidden, dim=-1)
        q = q.reshape(t, self.num_heads, self.head_dim)
        k = k.reshape(t, self.num_heads, self.head_dim)
        v = v.reshape(t, self.num_heads, self.head_dim)
        o = paged_attention(q, k, v, k_cache, v_cache, meta, ops, self.scale)
        return self.c_proj(o.reshape(t, -1))


class GPT2MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.c_fc = Conv1D(spec.hidden_size, spec.intermediate_size)
        self.c_proj = Conv1D(spec.intermediate_size, spec.hidden_size)
        self.act = _ACTIVATIONS[spec.activation]

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, spec: ModelSpec, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.attn = GPT2Attention(spec, layer_idx)
        self.ln_2 = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)
        self.mlp = GPT2MLP(spec)

    def forward(self, x, k_cache, v_cache, meta, ops):
        x = x + self.attn(self.ln_1(x), k_cache, v_cache, meta, ops)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.wte = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.wpe = nn.Embedding(spec.max_model_len, spec.hidden_size)
        self.h = nn.ModuleList(GPT2Block(spec, i) for i in range(spec.num_layers))
        self.ln_f = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.transformer = GPT2Model(spec)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, ops) -> torch.Tensor:
        """Hidden states [T, hidden] of the computed tokens; K/V stored into ``kv_cache``
        ([layers, 2, blocks, block_size, heads, head_dim])."""
        x = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for i, block in enumerate(self.transformer.h):
            x = block(x, kv_cache[i, 0], kv_cache[i, 1], meta, ops)
        return self.transformer.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
