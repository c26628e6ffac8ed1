"""Tiny random LLaMA checkpoints written in every format the loaders read (conftest.py hands them out as `ckpt`).

Every checkpoint is made here from random numbers; nothing is downloaded. The conversions below are
written independently of explorer_model (e.g. `permute` is copied from llama.cpp's converter), so the
loaders are checked against an outside reference rather than against themselves.
"""
from __future__ import annotations

import functools
import io
import json
import math
from pathlib import Path

import numpy as np
import torch

SENTENCES = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Attention is all you need; rotary position embeddings rotate pairs of numbers.",
    "A small model can still show how a transformer block works, one layer at a time.",
    "Tokens become vectors, vectors become logits, and logits become the next token.",
    "Grouped-query attention shares each key and value head among several query heads.",
    "RMSNorm divides by the root mean square; SwiGLU gates one projection with another.",
] * 4

VOCAB = 320  # every tiny model's vocabulary; the tokenizers below are smaller, the rest is padding

# Tiny LLaMA shapes, as LlamaConfig keyword arguments.
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
CASES = {
    "gqa": {},
    "tied_llama3": dict(tie_word_embeddings=True, rms_norm_eps=1e-6, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "linear": dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "head_dim": dict(head_dim=32, num_key_value_heads=1),
    # Llama-3.1's real constants, which Meta's params.json implies with use_scaled_rope
    "llama31": dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192}),
    "mha": dict(num_key_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
    # LlamaConfig's optional biases; q/k biases must be permuted with their rows
    "bias": dict(attention_bias=True, mlp_bias=True),
}


# --------------------------------------------------------------------------- HF
def hf_model(case: str = "gqa", seed: int = 0, **overrides):
    """A random LlamaForCausalLM. Weights are larger than HF's init so that RoPE, norms and attention all
    change the logits visibly; with std 0.02 a wrong permutation could hide below the tolerance."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = {**BASE, **CASES[case], **overrides}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**kwargs, attn_implementation="eager")).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]) * (2.0 if "embed" in name else 1.0))
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits


def random_tokens(n: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=None)
def _bpe_json() -> str:
    return _train_bpe().to_str()


def train_bpe_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_bpe_json())


def _train_bpe():
    """A byte-level BPE tokenizer (tokenizers library), as a tokenizers.Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    return tok


def write_tokenizer_json(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    train_bpe_tokenizer().save(str(path))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": False}))
    return path


def save_hf(model, folder: Path, tokenizer: bool = True, **save_kwargs) -> Path:
    model.save_pretrained(folder, **save_kwargs)
    if tokenizer:
        write_tokenizer_json(folder)
    return folder


def old_style_config(folder: Path) -> dict:
    """Rewrite config.json in the pre-v5 form: rope_theta and rope_scaling at the top level."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type")
    cfg["rope_scaling"] = None if kind == "default" else {"rope_type": kind, "type": kind, **rope}
    path.write_text(json.dumps(cfg, indent=2))
    return cfg


# --------------------------------------------------------------------------- layouts
def permute(weights: torch.Tensor, n_head: int, n_head_kv: int | None = None) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF half-split rows -> adjacent pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def hf_to_meta_state(model) -> dict[str, torch.Tensor]:
    """Meta consolidated.pth names, Q/K in Meta's (adjacent) layout."""
    c = model.config
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    if not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update({
            f"layers.{i}.attention_norm.weight": sd[p + "input_layernorm.weight"],
            f"layers.{i}.attention.wq.weight": permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads),
            f"layers.{i}.attention.wk.weight": permute(sd[p + "self_attn.k_proj.weight"], c.num_attention_heads,
                                                       c.num_key_value_heads),
            f"layers.{i}.attention.wv.weight": sd[p + "self_attn.v_proj.weight"],
            f"layers.{i}.attention.wo.weight": sd[p + "self_attn.o_proj.weight"],
            f"layers.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
            f"layers.{i}.feed_forward.w1.weight": sd[p + "mlp.gate_proj.weight"],
            f"layers.{i}.feed_forward.w2.weight": sd[p + "mlp.down_proj.weight"],
            f"layers.{i}.feed_forward.w3.weight": sd[p + "mlp.up_proj.weight"],
        })
    return out


@functools.lru_cache(maxsize=None)
def sentencepiece_model() -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES), model_writer=buf, vocab_size=316, model_type="bpe", byte_fallback=True,
        hard_vocab_limit=False, character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    return buf.getvalue()


def write_meta(model, folder: Path, shards: int = 1, tokenizer: bool = True, extra_params=None) -> Path:
    """A Meta release folder: params.json, consolidated.NN.pth split like fairscale's model parallelism."""
    c = model.config
    folder.mkdir(parents=True, exist_ok=True)
    rope = c.rope_parameters
    params = {"dim": c.hidden_size, "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
              "n_kv_heads": c.num_key_value_heads, "vocab_size": -1, "multiple_of": 32,
              "norm_eps": c.rms_norm_eps, "rope_theta": rope["rope_theta"], **(extra_params or {})}
    (folder / "params.json").write_text(json.dumps(params))
    state = hf_to_meta_state(model)
    split = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1, "tok_embeddings": 1}
    for rank in range(shards):
        part = {}
        for k, v in state.items():
            dim = split.get(k.split(".")[-2])
            part[k] = v if dim is None else v.chunk(shards, dim=dim)[rank].clone()
        torch.save(part, folder / f"consolidated.{rank:02d}.pth")
    if tokenizer:
        (folder / "tokenizer.model").write_bytes(sentencepiece_model())
    return folder


# --------------------------------------------------------------------------- GGUF
def gguf_with_cache(model, tokens: torch.Tensor, folder: Path):
    """`model` written as folder/m.gguf and loaded once with a converted cache in folder/cache:
    (gguf path, cache dir, the one cache file, the logits of that first load on `tokens`)."""
    from explorer_model import loaders

    path = write_gguf(model, folder / "m.gguf")
    cache_dir = folder / "cache"
    expected = loaders.load(path, cache_dir=cache_dir).model(tokens)
    [cache_file] = cache_dir.glob("*.safetensors")
    return path, cache_dir, cache_file, expected


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: llama3 scaling as per-frequency divisors."""
    base = rope["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _add_vocab(w, vocab: str, n: int) -> None:
    from gguf import TokenType

    if vocab == "llama":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model())
        tokens, scores, ttypes = [], [], []
        for i in range(sp.get_piece_size()):
            tokens.append(sp.id_to_piece(i))
            scores.append(sp.get_score(i))
            ttypes.append(TokenType.UNKNOWN if sp.is_unknown(i) else TokenType.CONTROL if sp.is_control(i)
                          else TokenType.BYTE if sp.is_byte(i) else TokenType.NORMAL)
        for i in range(len(tokens), n):  # llama.cpp pads a short vocab like this
            tokens.append(f"[PAD{i}]"), scores.append(-1000.0), ttypes.append(TokenType.UNUSED)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(ttypes)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_bos_token(True)
    else:
        spec = json.loads(train_bpe_tokenizer().to_str())
        vocab_map = spec["model"]["vocab"]
        tokens = [None] * len(vocab_map)
        for t, i in vocab_map.items():
            tokens[i] = t
        ttypes = [TokenType.CONTROL if t in ("<s>", "</s>") else TokenType.NORMAL for t in tokens]
        for i in range(len(tokens), n):
            tokens.append(f"[PAD{i}]"), ttypes.append(TokenType.UNUSED)
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types(ttypes)
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab_map["<s>"])
        w.add_eos_token_id(vocab_map["</s>"])
        w.add_add_bos_token(False)


def write_gguf(model, path: Path, qtype: str = "F32", vocab: str = "gpt2", arch: str = "llama",
               rope_freqs: bool = True, drop: tuple[str, ...] = ()) -> Path:
    """A GGUF file as llama.cpp's convert_hf_to_gguf.py writes one for a LlamaForCausalLM."""
    import gguf

    c = model.config
    head_dim = c.head_dim
    rope = c.rope_parameters
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny-llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    if head_dim != c.hidden_size // c.num_attention_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    qt = gguf.GGMLQuantizationType[qtype]
    w.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                     "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                     "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[qtype])
    if vocab:
        _add_vocab(w, vocab, c.vocab_size)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    sub = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    if rope["rope_type"] == "llama3" and rope_freqs:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if k in names:
            name = names[k]
        else:
            layer, rest = k[len("model.layers."):].split(".", 1)
            name = f"blk.{layer}.{sub[rest.removesuffix('.weight')]}.weight"
        if name in drop:
            continue
        v = v.detach()
        if name.endswith("attn_q.weight"):
            v = permute(v, c.num_attention_heads, c.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            v = permute(v, c.num_attention_heads, c.num_key_value_heads)
        data = v.numpy().astype(np.float32)
        if data.ndim == 2 and qt != gguf.GGMLQuantizationType.F32:  # norms stay F32, as in llama.cpp
            w.add_tensor(name, gguf.quants.quantize(data, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
