"""The architecture numbers our model code needs, read from a transformers config."""
from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    rope_theta: float
    max_model_len: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool
    eos_token_id: int | None
    bos_token_id: int | None

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelSpec":
        mt = cfg.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model type {mt!r}: this engine implements "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported RoPE scaling {rope_type!r} (only 'default' is implemented)")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {cfg.hidden_act!r} (only 'silu')")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        eos = cfg.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        qkv_bias = mt == "qwen2" or bool(getattr(cfg, "attention_bias", False))
        return cls(
            model_type=mt, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
            num_heads=heads, num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim, norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
            max_model_len=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=mt != "qwen2" and bool(getattr(cfg, "attention_bias", False)),
            eos_token_id=eos, bos_token_id=cfg.bos_token_id,
        )
