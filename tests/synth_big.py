"""Synthetic LLaMA checkpoints of real widths, random weights, written straight to disk in 16 bits.

Used by tests/test_dtype_7b.py (2 layers at the 7B width) and bench/bench_big.py (the full 7B/13B shapes).
Tensors are generated one shard at a time, so writing a 13.5 GB checkpoint never holds it in memory; the Meta
.pth is saved from a memory-mapped temporary safetensors file for the same reason (torch.save wants every
tensor at once).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

SEVEN_B = dict(vocab=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008)
THIRTEEN_B = dict(vocab=32000, d_model=5120, n_layers=40, n_heads=40, d_ff=13824)


def _meta_shapes(shape: dict, layers, top: bool = True):
    """(Meta name, shape) of every tensor of the given layers, plus embedding/norm/output if `top`, in order."""
    d, f, v = shape["d_model"], shape["d_ff"], shape["vocab"]
    if top:
        yield from (("tok_embeddings.weight", (v, d)), ("norm.weight", (d,)), ("output.weight", (v, d)))
    for i in layers:
        p = f"layers.{i}."
        for name, rows, cols in (("attention.wq", d, d), ("attention.wk", d, d), ("attention.wv", d, d),
                                 ("attention.wo", d, d), ("feed_forward.w1", f, d), ("feed_forward.w3", f, d),
                                 ("feed_forward.w2", d, f)):
            yield p + name + ".weight", (rows, cols)
        yield p + "attention_norm.weight", (d,)
        yield p + "ffn_norm.weight", (d,)


def _meta_tensors(shape: dict, layers, gen: torch.Generator, dtype: torch.dtype, top: bool):
    """(Meta name, random tensor) for the given layers, plus embedding/norm/output if `top`."""
    for name, size in _meta_shapes(shape, layers, top):
        if len(size) == 1:  # a norm's scales: around 1
            yield name, (1.0 + 0.1 * torch.randn(size, generator=gen)).to(dtype)
        else:  # drawn in the target dtype: no float32 copy to scale and convert; embedding entries of std 0.5,
            # as trained embeddings
            scale = math.sqrt(shape["d_model"]) * 0.5 if name == "tok_embeddings.weight" else 1.0
            yield name, torch.empty(size, dtype=dtype).normal_(0.0, scale / math.sqrt(size[1]), generator=gen)


_HF = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight", "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
       "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj",
       "feed_forward.w3": "mlp.up_proj", "feed_forward.w2": "mlp.down_proj",
       "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _hf_name(meta: str) -> str:
    if meta in _HF:
        return _HF[meta]
    _, i, rest = meta.split(".", 2)
    module = rest.rsplit(".", 1)[0]
    return f"model.layers.{i}.{_HF[module]}.weight"


def hf_config(shape: dict, n_layers: int, dtype: torch.dtype) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": shape["vocab"],
            "hidden_size": shape["d_model"], "intermediate_size": shape["d_ff"], "num_hidden_layers": n_layers,
            "num_attention_heads": shape["n_heads"], "num_key_value_heads": shape["n_heads"],
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch."), "_name_or_path": "synthetic-llama"}


def write_hf(folder: Path, shape: dict = SEVEN_B, n_layers: int | None = None, dtype=torch.bfloat16,
             layers_per_shard: int = 4, seed: int = 0) -> Path:
    """config.json + model-0000k-of-0000n.safetensors + index (+ tokenizer.json from checkpoints.py)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n_layers = n_layers or shape["n_layers"]
    gen = torch.Generator().manual_seed(seed)
    groups = [range(i, min(i + layers_per_shard, n_layers)) for i in range(0, n_layers, layers_per_shard)]
    weight_map, total = {}, 0
    for k, layers in enumerate(groups):
        name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {_hf_name(n): t for n, t in _meta_tensors(shape, layers, gen, dtype, top=k == 0)}
        save_file(part, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
        total += sum(t.numel() * t.element_size() for t in part.values())
        del part
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(hf_config(shape, n_layers, dtype)))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    _tokenizer(folder, "hf")
    return folder


def write_meta(folder: Path, shape: dict = SEVEN_B, n_layers: int | None = None, dtype=torch.float16,
               seed: int = 1, like: Path | None = None) -> Path:
    """params.json + consolidated.00.pth (one model-parallel rank) + tokenizer.model. `like`: a folder write_hf
    wrote with the same shape and at most 4 layers, whose weights are taken (in `dtype`) instead of drawing new
    ones: drawing is half of the time a 7B-width layer takes to write."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n_layers = n_layers or shape["n_layers"]
    gen = torch.Generator().manual_seed(seed)
    if n_layers <= 4:  # one part (the tests' 2 layers): it fits in memory, so no staging file to write and read
        if like is None:
            state = dict(_meta_tensors(shape, range(n_layers), gen, dtype, top=True))
        else:
            hf = {k: v for f in sorted(Path(like).glob("*.safetensors")) for k, v in load_file(f).items()}
            state = {name: hf[_hf_name(name)].to(dtype) for name, _ in _meta_shapes(shape, range(n_layers))}
        _save_pth(state, folder / "consolidated.00.pth")
        _meta_files(folder, shape, n_layers)
        return folder
    tmp = folder / ".staging"
    tmp.mkdir(exist_ok=True)
    for k, start in enumerate(range(0, n_layers, 4)):
        part = dict(_meta_tensors(shape, range(start, min(start + 4, n_layers)), gen, dtype, top=k == 0))
        save_file(part, tmp / f"{k:03d}.safetensors")
        del part
    state = {}
    for f in sorted(tmp.glob("*.safetensors")):
        state.update(load_file(f))  # memory-mapped: torch.save reads the pages as it writes them
    _save_pth(state, folder / "consolidated.00.pth")
    del state
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    _meta_files(folder, shape, n_layers)
    return folder


def _save_pth(state: dict, path: Path) -> None:
    """torch.save without the zip records' CRC32 (~2 s of CPU a GB; torch.load does not check it). The small Meta
    checkpoints of checkpoints.py keep theirs, so the loaders are tested on files with and without."""
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(True)


def _meta_files(folder: Path, shape: dict, n_layers: int) -> None:
    (folder / "params.json").write_text(json.dumps(
        {"dim": shape["d_model"], "n_layers": n_layers, "n_heads": shape["n_heads"], "multiple_of": 256,
         "norm_eps": 1e-6, "vocab_size": -1}))
    _tokenizer(folder, "meta")


def _tokenizer(folder: Path, kind: str) -> None:
    """The tiny test tokenizers of checkpoints.py (a 32000-row embedding works with a smaller vocabulary)."""
    import checkpoints

    if kind == "hf":
        checkpoints.write_tokenizer_json(folder)
    else:
        (folder / "tokenizer.model").write_bytes(checkpoints.sentencepiece_model())


def file_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.suffix in (".safetensors", ".pth"))
