"""The GGUF weight cache: hit and rebuild, a header or tensor bytes that changed, a file hashed once per process,
named by content (one cache for one file in two places, a replaced file's cache removed), a disk without room,
an unwritable folder, the folder from the environment."""
import os

import pytest
import torch

import explorer_model.loaders as L
import explorer_model.loaders.gguf as G

pytest.importorskip("transformers")  # the tiny checkpoints are written with LlamaForCausalLM

TOL = 1e-4


def max_diff(a, b):
    return (a - b).abs().max().item()


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


def test_unwritable_cache_only_warns(ckpt, tmp_path, gqa):
    model, tokens, ref = gqa
    path = ckpt.write_gguf(model, tmp_path / "m.gguf")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="weight cache"):
        loaded = L.load(path, cache_dir=blocker)
    assert max_diff(loaded.model(tokens), ref) <= TOL
