"""Model configuration: one frozen dataclass, one constructor per checkpoint format.

Nothing is assumed: eps, rope base, rope scaling, head size, KV heads and tying are read from
the checkpoint, and a missing required field is an error rather than a silent default.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any


class ConfigError(ValueError):
    """A checkpoint's configuration is missing a field or is inconsistent."""


def _positive(name: str, value) -> None:
    """A finite number > 0. Written as `not (x > 0)` so NaN fails too: NaN <= 0 is False, and a NaN
    rope_theta or scaling factor would load and fill every recorded pattern with NaN."""
    try:
        ok = math.isfinite(value) and value > 0
    except TypeError:
        ok = False
    if not ok:
        raise ConfigError(f"{name}={value!r} must be a finite number > 0")


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # "linear" | "llama3" | "factors" (per-frequency divisors, GGUF's rope_freqs tensor)
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position: int = 8192  # llama3 only
    factors: tuple[float, ...] = ()  # "factors" only

    def __post_init__(self):
        if self.kind not in ("linear", "llama3", "factors"):
            raise ConfigError(f"rope scaling kind {self.kind!r} is not one of linear, llama3, factors")
        _positive("rope_scaling.factor", self.factor)
        if self.kind == "llama3":
            _positive("rope_scaling.low_freq_factor", self.low_freq_factor)
            _positive("rope_scaling.high_freq_factor", self.high_freq_factor)
            _positive("rope_scaling.original_max_position_embeddings", self.original_max_position)
            if not self.high_freq_factor > self.low_freq_factor:  # the blend divides by their difference
                raise ConfigError(f"rope_scaling.high_freq_factor={self.high_freq_factor} must be greater than "
                                  f"low_freq_factor={self.low_freq_factor}")
        for i, f in enumerate(self.factors):
            _positive(f"rope_freqs[{i}]", f)

    @classmethod
    def from_hf(cls, d: dict[str, Any] | None) -> "RopeScaling | None":
        if not d:
            return None
        kind = d.get("rope_type", d.get("type", "default"))
        if kind == "default":
            return None
        if kind == "linear":
            return cls("linear", float(d["factor"]))
        if kind == "llama3":
            return cls(
                "llama3",
                float(d["factor"]),
                float(d["low_freq_factor"]),
                float(d["high_freq_factor"]),
                int(d["original_max_position_embeddings"]),
            )
        raise ConfigError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    norm_eps: float
    rope_theta: float
    max_seq_len: int
    tie_embeddings: bool
    rope_scaling: RopeScaling | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    # Variants for the Pre-Norm / Post-Norm comparison; LLaMA itself is ("pre", "rms", "swiglu").
    norm_placement: str = "pre"  # "pre": x + F(Norm(x)); "post": Norm(x + F(x))
    norm_type: str = "rms"  # "rms" | "layer"
    ffn_type: str = "swiglu"  # "swiglu" | "relu"
    attention_bias: bool = False  # biases on q/k/v/o (HF LlamaConfig.attention_bias)
    mlp_bias: bool = False  # biases on gate/up/down (HF LlamaConfig.mlp_bias)
    name: str = "llama"
    # Derived
    n_rep: int = field(init=False)  # query heads per KV head (GQA group size)

    def __post_init__(self):
        positive = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len")
        for k in positive:
            if int(getattr(self, k)) <= 0:
                raise ConfigError(f"{k} must be positive, got {getattr(self, k)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        _positive("norm_eps", self.norm_eps)
        if not self.norm_eps < 1:
            raise ConfigError(f"norm_eps={self.norm_eps} is out of range (0, 1)")
        _positive("rope_theta", self.rope_theta)
        if self.norm_placement not in ("pre", "post"):
            raise ConfigError(f"norm_placement must be 'pre' or 'post', got {self.norm_placement!r}")
        if self.norm_type not in ("rms", "layer"):
            raise ConfigError(f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}")
        if self.ffn_type not in ("swiglu", "relu"):
            raise ConfigError(f"ffn_type must be 'swiglu' or 'relu', got {self.ffn_type!r}")
        object.__setattr__(self, "n_rep", self.n_heads // self.n_kv_heads)

    def with_(self, **changes) -> "ModelConfig":
        changes.pop("n_rep", None)
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d.pop("n_rep")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = dict(d)
        d.pop("n_rep", None)
        if d.get("rope_scaling"):
            rs = dict(d["rope_scaling"])
            rs["factors"] = tuple(rs.get("factors", ()))
            d["rope_scaling"] = RopeScaling(**rs)
        return cls(**d)

    # ---------------------------------------------------------------- HF config.json
    @classmethod
    def from_hf_config(cls, c: dict[str, Any]) -> "ModelConfig":
        """Both the old form (rope_theta / rope_scaling at top level) and transformers v5's rope_parameters."""
        arch = c.get("model_type", "llama")
        if arch not in ("llama", "mistral") and "LlamaForCausalLM" not in c.get("architectures", []):
            raise ConfigError(f"config.json describes model_type {arch!r}, not a LLaMA")
        try:
            n_heads = int(c["num_attention_heads"])
            d_model = int(c["hidden_size"])
            rope = c.get("rope_parameters") or {}
            theta = rope.get("rope_theta", c.get("rope_theta"))
            if theta is None:
                raise KeyError("rope_theta")
            scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            eps = c["rms_norm_eps"]
            head_dim = c.get("head_dim") or d_model // n_heads
            act = c.get("hidden_act", "silu")
            if act not in ("silu", "swish"):  # the block's gate is SiLU: another would give other numbers silently
                raise ConfigError(f"config.json's hidden_act {act!r} is not SiLU, the gate a LLaMA block runs here")
            context = int(c.get("max_position_embeddings", 2048))
            window = c.get("sliding_window")  # Mistral: a query sees only the last `window` keys
            if window is not None and c.get("use_sliding_window", True) is not False:
                # while a prompt is no longer than the window, sliding-window attention is plain causal attention:
                # the model's context is cut to it rather than run past it with the wrong mask
                context = min(context, int(window))
            return cls(
                vocab_size=int(c["vocab_size"]),
                d_model=d_model,
                n_layers=int(c["num_hidden_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(c.get("num_key_value_heads") or n_heads),
                head_dim=int(head_dim),
                d_ff=int(c["intermediate_size"]),
                norm_eps=float(eps),
                rope_theta=float(theta),
                max_seq_len=context,
                tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                rope_scaling=RopeScaling.from_hf(scaling),
                bos_id=_first_id(c.get("bos_token_id")),
                eos_id=_first_id(c.get("eos_token_id")),
                attention_bias=bool(c.get("attention_bias", False)),
                mlp_bias=bool(c.get("mlp_bias", False)),
                name=c.get("_name_or_path") or arch,
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks required field {e.args[0]!r}") from None

    # ---------------------------------------------------------------- Meta params.json
    @classmethod
    def from_meta_params(cls, p: dict[str, Any], *, vocab_size: int, d_ff: int, tie_embeddings: bool,
                         bos_id: int | None = None, eos_id: int | None = None) -> "ModelConfig":
        """params.json does not hold the FFN width or vocabulary; the loader takes them from the weights."""
        try:
            dim, n_heads = int(p["dim"]), int(p["n_heads"])
            scaling = None
            if p.get("use_scaled_rope"):
                # Llama-3.1 params.json only sets a flag; its reference code fixes these constants.
                scaling = RopeScaling("llama3", float(p.get("rope_scaling_factor", 8.0)), 1.0, 4.0, 8192)
            return cls(
                vocab_size=vocab_size,
                d_model=dim,
                n_layers=int(p["n_layers"]),
                n_heads=n_heads,
                n_kv_heads=int(p.get("n_kv_heads") or n_heads),
                head_dim=dim // n_heads,
                d_ff=d_ff,
                norm_eps=float(p["norm_eps"]),
                # Meta's Llama-1/2 code hard-codes 10000 and has no field for it.
                rope_theta=float(p.get("rope_theta", 10000.0)),
                max_seq_len=int(p.get("max_seq_len", 2048)),
                tie_embeddings=tie_embeddings,
                rope_scaling=scaling,
                bos_id=bos_id,
                eos_id=eos_id,
                name="meta-llama",
            )
        except KeyError as e:
            raise ConfigError(f"params.json lacks required field {e.args[0]!r}") from None

    # ---------------------------------------------------------------- GGUF metadata
    @classmethod
    def from_gguf_metadata(cls, m: dict[str, Any], *, vocab_size: int, tie_embeddings: bool) -> "ModelConfig":
        arch = m.get("general.architecture")
        if arch != "llama":
            raise ConfigError(f"GGUF architecture is {arch!r}, only 'llama' is supported")

        def get(key, default=KeyError):
            v = m.get(f"llama.{key}", default)
            if v is KeyError:
                raise ConfigError(f"GGUF metadata lacks 'llama.{key}'")
            return v

        d_model, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
        head_dim = int(get("attention.key_length", 0) or get("rope.dimension_count", 0) or d_model // n_heads)
        scaling = None
        kind = get("rope.scaling.type", None)
        if kind == "linear":
            scaling = RopeScaling("linear", float(get("rope.scaling.factor")))
        elif kind not in (None, "none"):
            raise ConfigError(f"unsupported GGUF rope scaling type {kind!r}")
        # llama3 scaling is carried as a rope_freqs tensor in GGUF; the loader applies it.
        return cls(
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            d_ff=int(get("feed_forward_length")),
            norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            max_seq_len=int(get("context_length", 2048)),
            tie_embeddings=tie_embeddings,
            rope_scaling=scaling,
            bos_id=_first_id(m.get("tokenizer.ggml.bos_token_id")),
            eos_id=_first_id(m.get("tokenizer.ggml.eos_token_id")),
            name=str(m.get("general.name", "gguf-llama")),
        )


def _first_id(v) -> int | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return None if v is None else int(v)
