"""The architecture numbers our model code needs, read from a transformers config."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2")
LLAMA_FAMILY = ("llama", "mistral", "qwen2")
GPT2_ACTIVATIONS = ("gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "quick_gelu", "relu")


def sliding_window_of(cfg) -> int | None:
    """The window transformers really slides for this config, or None: a config's
    ``layer_types`` says which layers slide (Qwen2 derives them from ``max_window_layers``, so
    ``use_sliding_window`` with no sliding layer slides nothing); otherwise a set
    ``sliding_window`` slides every layer (Mistral, and Llama too: transformers' attention reads
    the field)."""
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return window if getattr(cfg, "use_sliding_window", True) else None


def _context_len(cfg) -> int:
    """Positions the model supports; capped at a sliding window since our attention is full
    attention, which equals windowed attention only within the window."""
    window = sliding_window_of(cfg)
    n = cfg.max_position_embeddings
    return min(n, window) if window else n


def eos_ids(eos) -> tuple[int, ...]:
    """A config's eos_token_id (None, an int or a list of ints) as a tuple of distinct ids."""
    if eos is None:
        return ()
    if isinstance(eos, int):
        return (eos,)
    return tuple(dict.fromkeys(int(e) for e in eos))


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
    eos_token_id: int | None            # the first of eos_token_ids (kept for display)
    bos_token_id: int | None
    # GPT-2 only (the Llama family uses SiLU and RoPE; these keep their defaults there)
    activation: str = "silu"
    attn_scale_inverse_layer: bool = False   # GPT-2 scale_attn_by_inverse_layer_idx
    scale_attn_weights: bool = True          # GPT-2: False = no 1/sqrt(head_dim)
    # every id that ends generation: config.json's eos_token_id (an int or a list), replaced by
    # generation_config.json's when that file sets one (transformers' generate reads it too)
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None      # the window transformers slides (caps max_model_len)

    def with_eos(self, eos) -> "ModelSpec":
        """The same spec with generation stopping on ``eos`` (an int, a list, or None)."""
        ids = eos_ids(eos)
        return dataclasses.replace(self, eos_token_ids=ids, eos_token_id=ids[0] if ids else None)

    @property
    def scale(self) -> float:
        """Base attention scale (a GPT-2 layer may further divide by layer_idx + 1)."""
        return self.head_dim ** -0.5 if self.scale_attn_weights else 1.0

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelSpec":
        mt = cfg.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model type {mt!r}: this engine implements "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        if mt == "gpt2":
            return cls._from_gpt2_config(cfg)
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported RoPE scaling {rope_type!r} (only 'default' is implemented)")
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):   # transformers: same
            raise ValueError(f"unsupported activation {cfg.hidden_act!r} (only 'silu')")
        if getattr(cfg, "mlp_bias", False):
            raise ValueError("unsupported mlp_bias=True (biases in the MLP's projections)")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        eos = eos_ids(cfg.eos_token_id)
        # Qwen2 always has q/k/v biases and no o_proj bias; only Llama reads attention_bias
        # (transformers' MistralAttention has no biases whatever the config says)
        llama_bias = mt == "llama" and bool(getattr(cfg, "attention_bias", False))
        qkv_bias = mt == "qwen2" or llama_bias
        return cls(
            model_type=mt, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
            num_heads=heads, num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim, norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
            max_model_len=_context_len(cfg), sliding_window=sliding_window_of(cfg),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=llama_bias,
            eos_token_id=eos[0] if eos else None, bos_token_id=cfg.bos_token_id,
            eos_token_ids=eos,
        )

    @classmethod
    def synthetic(cls, vocab_size: int, max_model_len: int) -> "ModelSpec":
        """No model at all: the length-only simulator's stand-in (no EOS: lengths are exact)."""
        return cls("synthetic", vocab_size, 0, 0, 0, 1, 1, 1, 1e-6, 10000.0, max_model_len,
                   False, False, False, None, None)

    @classmethod
    def _from_gpt2_config(cls, cfg) -> "ModelSpec":
        """GPT-2: learned positions, MHA, LayerNorm, fused c_attn, tied lm_head by default."""
        act = getattr(cfg, "activation_function", "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            raise ValueError(f"unsupported activation {act!r} for gpt2 (one of {GPT2_ACTIVATIONS})")
        if getattr(cfg, "add_cross_attention", False):
            raise ValueError("gpt2 with cross-attention (an encoder-decoder) is not supported")
        hidden, heads = cfg.n_embd, cfg.n_head
        if hidden % heads:
            raise ValueError(f"n_embd {hidden} is not a multiple of n_head {heads}")
        eos = eos_ids(cfg.eos_token_id)
        return cls(
            model_type="gpt2", vocab_size=cfg.vocab_size, hidden_size=hidden,
            intermediate_size=getattr(cfg, "n_inner", None) or 4 * hidden,
            num_layers=cfg.n_layer, num_heads=heads, num_kv_heads=heads,
            head_dim=hidden // heads, norm_eps=cfg.layer_norm_epsilon, rope_theta=0.0,
            max_model_len=cfg.n_positions,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", True)),
            attention_bias=True, o_proj_bias=True,
            eos_token_id=eos[0] if eos else None, bos_token_id=cfg.bos_token_id,
            eos_token_ids=eos, activation=act,
            attn_scale_inverse_layer=bool(getattr(cfg, "scale_attn_by_inverse_layer_idx", False)),
            scale_attn_weights=bool(getattr(cfg, "scale_attn_weights", True)),
        )
