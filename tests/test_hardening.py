"""Model files: each class of hostile or careless input, several members each, through the Python API
and the CLI. Every refusal is one line naming the problem, the CLI exits with status 2, and nothing is written:
no weight cache, no recording. Where a damaged cache is involved the answer must be the right one, not a refusal.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
from conftest import no_hang
import torch

import explorer_model.loaders as L
import explorer_model.loaders.gguf as G
from explorer_model import cli
from explorer_model.loaders import LoadError

TOL = 2e-4


def refused(source, tmp_path, capsys, *needles):
    """The API raises one LoadError line with the needles; the CLI's `record` exits 2 with the same line and
    writes neither a recording nor a weight cache."""
    cache = tmp_path / "cache-refused"
    capsys.readouterr()  # what writing the fixture printed
    with no_hang(60), pytest.raises(LoadError) as e:  # e.g. 10^9 layers must be refused, not built
        L.load(source, cache_dir=cache)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n.lower() in msg.lower(), msg
    out = tmp_path / "rec.npz"
    os.environ["LLAMA_EXPLORER_CACHE"] = str(cache)
    try:
        code = cli.main(["record", str(source), "--token-ids", "1,2,3", "--out", str(out)])
    finally:
        del os.environ["LLAMA_EXPLORER_CACHE"]
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("llama-explorer: error:"), err
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    assert not out.exists() and not list(tmp_path.glob(".rec.npz*"))
    assert not list(cache.glob("*.safetensors")) and not list(cache.glob(".*tmp"))
    return msg


# --------------------------------------------------------------------------- GGUF byte surgery
def gguf_layout(path):
    """name -> byte positions of (n_dims, dims, type, offset) in the tensor table; field name -> value position."""
    import gguf

    r = gguf.GGUFReader(path)
    base = r.data.__array_interface__["data"][0]

    def pos(part):
        return part.__array_interface__["data"][0] - base

    table = {t.name: [pos(p) for p in t.field.parts[2:]] + [int(t.field.parts[-1][0]), list(map(int, t.shape))]
             for t in r.tensors}
    fields = {name: pos(f.parts[-1]) for name, f in r.fields.items()}
    order = sorted(table, key=lambda n: table[n][4])  # by offset in the data section
    return table, fields, order, int(r.data_offset)


def poke(src, dst, edits):
    data = bytearray(src.read_bytes())
    for at, raw in edits:
        data[at:at + len(raw)] = raw
    dst.write_bytes(bytes(data))
    return dst


def u64(v):
    return struct.pack("<Q", v % 2**64)


@pytest.fixture(scope="module")
def good_gguf(ckpt, gqa, tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return ckpt.write_gguf(gqa[0], d / "good.gguf"), ckpt.write_gguf(gqa[0], d / "q8.gguf", qtype="Q8_0")


def table_edit(kind, path):
    table, _, order, start = gguf_layout(path)
    first, second, last = order[0], order[1], order[-1]
    nd, dims, typ, off = (table[second][i] for i in range(4))
    offset, shape = table[second][4], table[second][5]
    if kind == "misaligned":
        return [(off, u64(offset + 4))]
    if kind == "past_end":
        return [(table[last][3], u64(table[last][4] + 2**30))]
    if kind == "wraps_to_the_header":  # start + offset overflows 64 bits and lands on byte 0 of the file
        return [(off, u64(2**64 - start))]
    if kind == "overlap":
        return [(off, u64(table[first][4]))]
    if kind == "smaller_type":  # F32 declared F16: half the bytes, the rest of the span unused
        return [(typ, struct.pack("<I", 1))]
    if kind == "larger_type":  # F32 declared F64: runs into the next tensor
        return [(typ, struct.pack("<I", 28))]
    if kind == "wrong_shape":
        return [(dims + 8, u64(shape[1] * 2))] if len(shape) > 1 else [(dims, u64(shape[0] * 2))]
    if kind == "zero_dim":
        return [(dims, u64(0))]
    if kind == "huge_dims":
        return [(dims, u64(2**40))] + ([(dims + 8, u64(2**40))] if len(shape) > 1 else [])
    if kind == "five_dims":
        return [(nd, struct.pack("<I", 5))]
    raise KeyError(kind)


# What each tampering is refused with: gguf's own reader already fails on some (a tensor past the end of a
# short file, absurd dimensions), check_tensor_table names the rest.
TABLE = {"misaligned": ["not a multiple of the alignment"], "past_end": ["truncated or corrupt GGUF file"],
         "wraps_to_the_header": ["run past the end"], "overlap": ["overlap ("],
         "smaller_type": ["unused bytes between tensors"], "larger_type": ["overlap ("],
         "wrong_shape": ["overlap ("], "zero_dim": ["impossible shape"],
         "huge_dims": ["truncated or corrupt GGUF file"], "five_dims": ["truncated or corrupt GGUF file"]}


@pytest.mark.parametrize("kind", list(TABLE))
def test_bad_tensor_table_is_refused(good_gguf, tmp_path, capsys, kind):
    src = good_gguf[0]
    bad = poke(src, tmp_path / f"{kind}.gguf", table_edit(kind, src))
    edited = gguf_layout(src)[2][1]  # the tensor whose table entry was changed: the line names it
    named = [f"{edited} "] if kind in ("overlap", "smaller_type", "larger_type", "wrong_shape") else []
    refused(bad, tmp_path, capsys, f"{kind}.gguf", *TABLE[kind], *named)


def test_quantized_rows_that_are_not_whole_blocks(good_gguf, tmp_path, capsys):
    src = good_gguf[1]
    table, *_ = gguf_layout(src)
    name = next(n for n, v in table.items() if len(v[5]) == 2 and v[5][0] % 32 == 0)
    bad = poke(src, tmp_path / "rows.gguf", [(table[name][1], u64(33))])
    refused(bad, tmp_path, capsys, "rows.gguf")


def test_untouched_files_pass_the_table_check(good_gguf, gqa):
    """The check refuses nothing a converter writes: plain, quantized and the default model."""
    for path in good_gguf:
        reader = G.open_reader(path)
        G.check_tensor_table(reader, path)
    G.check_tensor_table(G.open_reader(L.default_gguf_path()), L.default_gguf_path())


# --------------------------------------------------------------------------- non-finite / degenerate numbers
GGUF_NUMBERS = [("llama.rope.freq_base", float("nan"), "rope_theta"),
                ("llama.rope.freq_base", float("inf"), "rope_theta"),
                ("llama.rope.freq_base", -10000.0, "rope_theta"),
                ("llama.attention.layer_norm_rms_epsilon", float("nan"), "norm_eps"),
                ("llama.attention.layer_norm_rms_epsilon", 0.0, "norm_eps")]


@pytest.mark.parametrize("field, value, needle", GGUF_NUMBERS)
def test_gguf_non_finite_numbers(good_gguf, tmp_path, capsys, field, value, needle):
    src = good_gguf[0]
    _, fields, _, _ = gguf_layout(src)
    bad = poke(src, tmp_path / "nan.gguf", [(fields[field], struct.pack("<f", value))])
    refused(bad, tmp_path, capsys, needle)


@pytest.mark.parametrize("value", [float("nan"), 0.0, -1.0])
def test_gguf_rope_freqs_tensor_with_bad_factor(ckpt, tmp_path, capsys, value):
    model = ckpt.hf_model("llama31", seed=2)
    src = ckpt.write_gguf(model, tmp_path / "src.gguf")
    table, *_ = gguf_layout(src)
    at = G.open_reader(src).data_offset + table["rope_freqs.weight"][4] + 4 * 3
    bad = poke(src, tmp_path / "freqs.gguf", [(at, struct.pack("<f", value))])
    refused(bad, tmp_path, capsys, "rope_freqs[3]")


HF_NUMBERS = [
    ({"rope_theta": float("nan")}, "rope_theta"),
    ({"rope_theta": float("-inf")}, "rope_theta"),
    ({"rms_norm_eps": float("inf")}, "norm_eps"),
    ({"rms_norm_eps": float("nan")}, "norm_eps"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": float("nan")}}, "rope_scaling.factor"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -2}}, "rope_scaling.factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 2, "high_freq_factor": 2,
                       "original_max_position_embeddings": 8192}}, "high_freq_factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": float("nan"), "high_freq_factor": 4,
                       "original_max_position_embeddings": 8192}}, "low_freq_factor"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": 0}}, "original_max_position"),
]


@pytest.mark.parametrize("change, needle", HF_NUMBERS)
def test_hf_config_non_finite_numbers(ckpt, gqa, tmp_path, capsys, change, needle):
    folder = ckpt.save_hf(gqa[0], tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update({"rope_theta": 10000.0, **change})
    (folder / "config.json").write_text(json.dumps(cfg))  # json writes NaN / Infinity, as Python's reader accepts
    refused(folder, tmp_path, capsys, "config.json", needle)


@pytest.mark.parametrize("change, needle", [({"norm_eps": float("nan")}, "norm_eps"),
                                            ({"rope_theta": float("-inf")}, "rope_theta"),
                                            ({"use_scaled_rope": True, "rope_scaling_factor": 0}, "factor")])
def test_meta_params_non_finite_numbers(ckpt, gqa, tmp_path, capsys, change, needle):
    folder = ckpt.write_meta(gqa[0], tmp_path / "meta", extra_params=change)
    refused(folder, tmp_path, capsys, "params.json", needle)


@pytest.mark.parametrize("change, needle", [({"rope_theta": float("nan")}, "rope_theta"),
                                            ({"norm_eps": float("inf")}, "norm_eps")])
def test_explorer_config_non_finite_numbers(tmp_path, capsys, change, needle):
    from explorer_model.paths import ASSETS

    folder = tmp_path / "twin"
    shutil.copytree(ASSETS / "tiny-pre", folder)
    cfg = json.loads((folder / "explorer_config.json").read_text())
    (folder / "explorer_config.json").write_text(json.dumps({**cfg, **change}))
    refused(folder, tmp_path, capsys, "explorer_config.json", needle)


# --------------------------------------------------------------------------- sizes against the tensors present
def test_absurd_layer_counts_fail_fast(ckpt, gqa, good_gguf, tmp_path, capsys):
    _, fields, _, _ = gguf_layout(good_gguf[0])
    gguf = poke(good_gguf[0], tmp_path / "layers.gguf", [(fields["llama.block_count"], struct.pack("<I", 10**9))])
    refused(gguf, tmp_path, capsys, "1000000000 layers", "2 (blocks 0..1)")
    hf = ckpt.save_hf(gqa[0], tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 10**9}))
    refused(hf, tmp_path, capsys, "1000000000 layers")
    meta = ckpt.write_meta(gqa[0], tmp_path / "meta", extra_params={"n_layers": 10**9})
    refused(meta, tmp_path, capsys, "1000000000 layers")
    (hf / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))  # fewer than present
    refused(hf, tmp_path, capsys, "1 layers", "2 (blocks 0..1)")


@pytest.mark.parametrize("change, implied", [({"hidden_size": 10**9}, 10**9), ({"vocab_size": 10**12}, 10**12),
                                             ({"intermediate_size": 10**10}, 10**10),
                                             ({"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2**40},
                                              2**41)])
def test_absurd_widths_fail_fast(ckpt, gqa, tmp_path, capsys, change, implied):
    hf = ckpt.save_hf(gqa[0], tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, **change}))
    refused(hf, tmp_path, capsys, "shape mismatch", str(implied))


# --------------------------------------------------------------------------- tokenizer larger than the embedding
def test_tokenizer_larger_than_embedding(ckpt, tmp_path, capsys):
    small = ckpt.hf_model("gqa", seed=3, vocab_size=200)
    for vocab in ("gpt2", "llama"):
        path = ckpt.write_gguf(small, tmp_path / f"{vocab}.gguf", vocab=vocab)
        refused(path, tmp_path, capsys, f"tokenizer has {316 if vocab == 'llama' else 300} tokens", "only 200")
    refused(ckpt.save_hf(small, tmp_path / "hf"), tmp_path, capsys, "tokenizer has 300 tokens", "only 200")
    refused(ckpt.write_meta(small, tmp_path / "meta"), tmp_path, capsys, "tokenizer has 316 tokens", "only 200")


# --------------------------------------------------------------------------- weight cache
def header_edit(cache_file, key, new_value):
    """Change one value inside the cache's JSON header, keeping its length so the file stays well-formed."""
    data = cache_file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].decode()
    at = header.index(key) + len(key)
    old = header[at:at + len(new_value)]
    assert old != new_value
    cache_file.write_bytes(data[:8] + (header[:at] + new_value + header[at + len(new_value):]).encode() + data[8 + n:])


@pytest.mark.parametrize("key, new", [('norm_eps\\": ', "2"), ('rope_theta\\": ', "9"), ('n_kv_heads\\": ', "4"),
                                      ('tokenizer.ggml.tokens\\": [\\"', "X"), ('"note":"', "Q"),
                                      ('"crc3', "X")])  # the last: a header without its checksum
def test_tampered_cache_header_is_rebuilt(ckpt, gqa, tmp_path, capsys, key, new):
    model, tokens, ref = gqa
    path, cache_dir, cache, expected = ckpt.gguf_with_cache(model, tokens, tmp_path)
    header_edit(cache, key, new)
    assert G.read_cache(cache) is None, "an edited header must not pass the checksum"
    again = L.load(path, cache_dir=cache_dir)
    assert torch.equal(again.model(tokens), expected)
    assert again.tokenizer.encode("the cat") == L.load(path, cache_dir=tmp_path / "fresh").tokenizer.encode("the cat")
    # and the recording made through a cache tampered the same way holds the true logits
    del again
    header_edit(cache, key, new)
    out = tmp_path / "r.npz"
    os.environ["LLAMA_EXPLORER_CACHE"] = str(cache_dir)
    try:
        assert cli.main(["record", str(path), "--token-ids", ",".join(map(str, tokens[0].tolist())),
                         "--out", str(out), "--names", "hook_embed"]) == 0
    finally:
        del os.environ["LLAMA_EXPLORER_CACHE"]
    import numpy as np

    assert (torch.from_numpy(np.load(out)["logits"]) - ref).abs().max() <= TOL


def test_same_size_same_mtime_replacement_loads_the_new_weights(ckpt, gqa, tmp_path):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    assert (L.load(path, cache_dir=cache_dir).model(tokens) - ref).abs().max() <= TOL
    st = path.stat()
    other = ckpt.hf_model("gqa", seed=12)
    new = ckpt.write_gguf(other, tmp_path / "new.gguf")
    assert new.stat().st_size == st.st_size
    shutil.copyfile(new, path)  # what rsync -t or tar do: same size, same mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns
    got = L.load(path, cache_dir=cache_dir).model(tokens)
    assert (got - ckpt.hf_logits(other, tokens)).abs().max() <= TOL
    assert len(list(cache_dir.glob("*.safetensors"))) == 1  # the old entry was dropped


def test_two_first_loads_at_once_convert_once(ckpt, gqa, tmp_path):
    """Two processes load the same GGUF with no cache yet (a server's processes starting on a new machine): one
    converts it, the other waits for the folder's lock and loads the cache the first one wrote."""
    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf")
    cache_dir, log = tmp_path / "cache", tmp_path / "converted.log"
    code = ("import sys, time, explorer_model.loaders.gguf as g\n"
            "real = g.convert\n"
            "def convert(*a, **k):\n"
            "    open(sys.argv[3], 'a').write('converted\\n')\n"
            "    time.sleep(1.5)  # long enough for the other process to reach the lock\n"
            "    return real(*a, **k)\n"
            "g.convert = convert\n"
            "from explorer_model.loaders import load\n"
            "print(float(load(sys.argv[1], cache_dir=sys.argv[2]).model(__import__('torch').tensor([[3, 1, 4]])).sum()))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(cache_dir), str(log)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    assert log.read_text().count("converted") == 1
    assert outs[0][0] == outs[1][0]  # the same weights in both
    assert len(list(cache_dir.glob("*.safetensors"))) == 1


def test_temporaries_of_a_killed_first_load_are_removed(ckpt, gqa, tmp_path):
    path = ckpt.write_gguf(gqa[0], tmp_path / "m.gguf")
    cache_dir = tmp_path / "cache"
    # a first load killed in the middle of writing its cache (os._exit: no cleanup code runs)
    code = ("import os, sys, explorer_model.loaders.gguf as g\n"
            "def die(state, path, metadata):\n"
            "    open(path, 'wb').write(b'half a cache')\n"
            "    os._exit(9)\n"
            "g.save_streaming = die\n"
            "from explorer_model.loaders import load\n"
            "load(sys.argv[1], cache_dir=sys.argv[2])\n")
    r = subprocess.run([sys.executable, "-c", code, str(path), str(cache_dir)], capture_output=True)
    assert r.returncode == 9, r.stderr
    [left] = cache_dir.glob(".*.tmp")
    alive = cache_dir / f".other.safetensors.{os.getppid()}.tmp"  # a live writer's temporary stays
    alive.write_bytes(b"in progress")
    L.load(path, cache_dir=cache_dir)
    assert not left.exists() and alive.exists()
    assert len(list(cache_dir.glob("*.safetensors"))) == 1
