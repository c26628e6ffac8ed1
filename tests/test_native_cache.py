"""The compiled decode step's cache (explorer_model/generate/native_build.py): a library is loaded only when its SHA-256
matches the one recorded at build time, from a folder only its owner can write; everything else (no compiler, a
compiler without -march=native, a read-only or shared folder, a damaged or planted file) ends in a fresh build or
in the torch step, never in a crash. Each case runs in its own process with its own cache folder."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GCC = shutil.which("gcc") or shutil.which("cc")
pytestmark = [pytest.mark.skipif(GCC is None, reason="no C compiler"),
              pytest.mark.slow]  # each test compiles or loads a library in a child process

PROBE = textwrap.dedent("""
    import json, sys
    import explorer_model.generate.native_build as n
    lib = n.library()
    json.dump({"loaded": getattr(lib, "_name", None), "failure": n.failure(), "key": n._key(),
               "folder": str(n.build_folder())}, sys.stdout)
""")


def probe(cache: Path, **env) -> dict:
    """library() in a fresh process with LLAMA_EXPLORER_CACHE=cache; the process must end normally."""
    full = dict(os.environ, LLAMA_EXPLORER_CACHE=str(cache), PYTHONPATH=str(ROOT), OMP_WAIT_POLICY="PASSIVE", **env)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=full, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout)


def fake_compiler(tmp_path: Path, refuse: str) -> Path:
    """A `cc` that fails whenever its arguments hold `refuse`, and is gcc otherwise."""
    script = tmp_path / "fake-cc"
    script.write_text(f'#!/bin/sh\ncase "$*" in *{refuse}*) echo "unknown option {refuse}" >&2; exit 1;; esac\n'
                      f'exec {GCC} "$@"\n')
    script.chmod(0o755)
    return script


def tiny_library(tmp_path: Path, out: Path, marker: Path | None = None, entry: bool = False) -> None:
    """A shared library whose constructor writes `marker`, with or without a `llama_forward`."""
    src = tmp_path / "planted.c"
    body = "#include <stdio.h>\n"
    if marker is not None:
        body += f'__attribute__((constructor)) static void run(void) {{ FILE *f = fopen("{marker}", "w"); ' \
                'if (f) fclose(f); }\n'
    body += "int llama_forward(void) { return 0; }\n" if entry else "int something_else(void) { return 1; }\n"
    src.write_text(body)
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)


def build(cache: Path) -> tuple[Path, Path]:
    """A fresh build in `cache`: the library and its record."""
    first = probe(cache)
    assert first["loaded"] and first["failure"] is None, first
    so = Path(first["loaded"])
    return so, so.with_suffix(".sha256")


@pytest.fixture(scope="module")
def one_build(tmp_path_factory) -> tuple[Path, Path]:
    """One fresh build for the module (its cache folder and library), copied into each test's own cache."""
    cache = tmp_path_factory.mktemp("native") / "cache"
    return cache, build(cache)[0]


@pytest.fixture
def built(one_build, tmp_path):
    """A test's own cache holding a library built here, as a fresh build leaves it (modes kept): its library and
    record (a test that plants or damages files changes only its copy)."""
    source, so = one_build
    cache = tmp_path / "cache"
    shutil.copytree(source, cache, symlinks=True)
    mine = cache / so.relative_to(source)
    return mine, mine.with_suffix(".sha256")


def test_build_records_its_hash_in_a_private_folder(tmp_path):
    so, record = build(tmp_path / "cache")
    import hashlib

    assert record.read_text().strip() == hashlib.sha256(so.read_bytes()).hexdigest()
    assert stat.S_IMODE(so.parent.stat().st_mode) == 0o700


def test_truncated_library_is_rebuilt_not_mapped(tmp_path, built):
    so, record = built
    good = so.read_bytes()
    so.write_bytes(good[:1000])  # mapped as is, this dies with SIGBUS
    again = probe(tmp_path / "cache")
    assert again["loaded"] == str(so) and again["failure"] is None
    assert so.read_bytes() == good


def test_planted_library_without_a_record_is_never_opened(tmp_path, built):
    cache = tmp_path / "cache"
    so, record = built
    marker = tmp_path / "constructor-ran"
    for with_record in (False, True):  # no record, then a record of other content
        tiny_library(tmp_path, so, marker, entry=True)
        if with_record:
            record.write_text("0" * 64 + "\n")
        else:
            record.unlink()
        assert probe(cache)["loaded"] == str(so)
        assert not marker.exists(), "the planted library's constructor ran"


def test_library_without_the_entry_point_falls_back(tmp_path, built):
    import hashlib

    cache = tmp_path / "cache"
    so, record = built
    tiny_library(tmp_path, so)  # recorded as if built here, but without llama_forward
    record.write_text(hashlib.sha256(so.read_bytes()).hexdigest() + "\n")
    again = probe(cache)
    assert again["failure"] is None and again["loaded"] != str(so), again  # built privately instead
    assert not so.exists()  # and the next run builds it again
    assert probe(cache)["loaded"] == str(so) and b"llama_forward" in so.read_bytes()


def test_killed_compiles_are_swept(tmp_path, built):
    cache = tmp_path / "cache"
    so, _ = built
    dead = subprocess.Popen(["true"])
    dead.wait()
    named = so.parent / f".{so.stem}.{dead.pid}.tmp"
    unnamed = so.parent / ".native_step-x1y2z3.so"
    alive = so.parent / f".{so.stem}.{os.getpid()}.tmp"
    for f in (named, unnamed, alive):
        f.write_bytes(b"half a library")
    os.utime(unnamed, (0, 0))
    probe(cache)
    assert not named.exists() and not unnamed.exists()
    assert alive.exists()  # a compile still running is left alone


def test_no_compiler_falls_back_to_torch(tmp_path):
    for env in ({"CC": str(tmp_path / "no-such-cc")}, {"CC": "cc", "PATH": str(tmp_path)}):
        got = probe(tmp_path / "cache", **env)
        assert got["loaded"] is None and got["failure"], got


def test_compiler_without_march_native_gets_mcpu_then_nothing(tmp_path):
    for refuse in ("-march=native", "=native"):  # clang on arm64; a compiler with neither
        got = probe(tmp_path / refuse, CC=str(fake_compiler(tmp_path, refuse)))
        assert got["loaded"] and got["failure"] is None, got


def test_folder_others_can_write_is_refused(tmp_path, built):
    cache = tmp_path / "cache"
    so, record = built
    marker = tmp_path / "constructor-ran"
    tiny_library(tmp_path, so, marker, entry=True)
    import hashlib

    record.write_text(hashlib.sha256(so.read_bytes()).hexdigest() + "\n")  # a record planted with it
    so.parent.chmod(0o777)
    got = probe(cache)
    assert got["loaded"] and Path(got["loaded"]).parent != so.parent and got["failure"] is None, got
    assert not marker.exists(), "a library from a folder anyone can write was opened"
    so.parent.chmod(0o700)
    if os.geteuid() == 0:  # owned by another user
        os.chown(so.parent, 65534, 65534)
        got = probe(cache)
        assert got["loaded"] and Path(got["loaded"]).parent != so.parent, got
        assert not marker.exists()


def test_two_first_uses_at_once_build_once(tmp_path):
    """Two processes need the compiled step at once with an empty cache (a server's processes starting on a new
    machine): one compiles, the other waits for the folder's build lock and loads that library."""
    cache, log = tmp_path / "cache", tmp_path / "compiles.log"
    slow = tmp_path / "slow-cc"  # logs each compile and takes long enough for the other process to arrive
    slow.write_text(f'#!/bin/sh\necho compile >> {log}\nsleep 1.5\nexec {GCC} "$@"\n')
    slow.chmod(0o755)
    env = dict(os.environ, LLAMA_EXPLORER_CACHE=str(cache), PYTHONPATH=str(ROOT), CC=str(slow))
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    got = [json.loads(out) for out, _ in outs]
    assert log.read_text().count("compile") == 1
    assert got[0]["loaded"] == got[1]["loaded"] and Path(got[0]["loaded"]).parent == cache / "native-step", got
    assert sorted(p.name for p in (cache / "native-step").iterdir()) == sorted(
        [".building.lock", Path(got[0]["loaded"]).name, Path(got[0]["loaded"]).with_suffix(".sha256").name])


def test_read_only_cache_builds_privately(tmp_path):
    cache = tmp_path / "cache"
    (cache / "native-step").mkdir(parents=True, mode=0o700)
    if subprocess.run(["chattr", "+i", str(cache / "native-step")], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        got = probe(cache)
    finally:
        subprocess.run(["chattr", "-i", str(cache / "native-step")])
    assert got["loaded"] and got["failure"] is None and not Path(got["loaded"]).exists(), got
    assert list((cache / "native-step").iterdir()) == []


def test_two_cpus_sharing_a_folder_get_their_own_builds(tmp_path, monkeypatch):
    import explorer_model.generate.native_build as native

    monkeypatch.setattr(native, "_cpu_key", lambda: "x86_64|flags : avx512f")
    one = native._key()
    monkeypatch.setattr(native, "_cpu_key", lambda: "x86_64|flags : avx2")
    assert native._key() != one
    monkeypatch.undo()
    here = native._cpu_key()
    assert "flags" in here or "Features" in here, here  # the instructions the build may use are in the key
