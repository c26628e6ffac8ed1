"""The command line and the Python API around it: text that is not text, oversized prompts, odd numbers,
closed pipes, out-of-memory, and --out. Each ends in one line and exit status 2, and nothing is written or lost:
a refused or failed `record` leaves the previous file byte for byte and no temporary beside it.
"""
import errno
import re
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from explorer_model import cli
from explorer_model import export
from explorer_model.loaders import LoadError, load
from explorer_model.tokenizer import MAX_PROMPT_CHARS, PromptError, check_prompt

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def one_line(code, err, *needles):
    # a warning line (e.g. the weight cache could not be written under the same limit) may come first
    lines = [l for l in err.strip().splitlines() if l.strip() and not l.startswith("llama-explorer: warning:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("llama-explorer: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    return lines[0]


def run(args, **kw):
    """The CLI in its own process; args may be bytes (argv that is not UTF-8)."""
    return subprocess.run([sys.executable, "-m", "explorer_model.cli", *args], capture_output=True, env=ENV,
                          timeout=180, **kw)


@pytest.fixture(scope="module")
def smol():
    return load("smollm2")


@pytest.fixture
def previous(tmp_path):
    """An existing output file that every failed write must leave as it was."""
    out = tmp_path / "r.npz"
    out.write_bytes(b"the previous recording")
    return out


def untouched(out):
    assert out.read_bytes() == b"the previous recording"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "a temporary was left behind"


def test_the_api_refuses_ids_a_model_cannot_run_with_the_clis_line(smol, capsys, tmp_path):
    """record() on an empty prompt, an id past the embedding or more ids than the context: PromptError with the line
    the CLI prints for the same ids (an empty list crashed in the RoPE table; an id past the embedding raised
    torch's "index out of range in self")."""
    from explorer_model.recording import record, recorder

    cfg = smol.model.cfg
    for ids, needle in (([], "the prompt has no tokens"),
                        ([1, cfg.vocab_size], f"token id {cfg.vocab_size} is out of range (the vocabulary has "),
                        ([-1], "token id -1 is out of range"),
                        ([1] * (cfg.max_seq_len + 1), f"more than this model's context of {cfg.max_seq_len}")):
        with pytest.raises(PromptError, match=re.escape(needle)):
            record(smol.model, ids)
        if ids and ids != [-1]:
            out = tmp_path / "x.npz"
            one_line(cli.main(["record", "smollm2", "--token-ids", ",".join(map(str, ids)), "--out", str(out)]),
                     capsys.readouterr().err, needle)
            assert not out.exists()
    with pytest.raises(PromptError, match=re.escape("record() takes token ids, not text: tokenizer.encode_prompt")):
        record(smol.model, "The capital of France is")  # text where ids go (torch said "invalid data type 'str'")
    for empty in ("", "  \n "):  # text with nothing in it: not a run of the BOS alone
        with pytest.raises(PromptError, match="the prompt is empty"):
            smol.tokenizer.encode_prompt(empty)
    # a selection that records nothing, or everything, is refused or read as meant, as the CLI's --names
    for kw, needle in ((dict(names=["nosuch"]), "'nosuch' matches no hook point"),
                       (dict(layers=[cfg.n_layers]), f"layer {cfg.n_layers} does not exist"),
                       (dict(names=[]), "names is empty: nothing would be recorded")):
        with pytest.raises(ValueError, match=re.escape(needle)):
            record(smol.model, [1, 2], **kw)
        with pytest.raises(ValueError, match=re.escape(needle)):  # recorder() around a forward of one's own too
            with recorder(smol.model, **kw):
                pass
    assert record(smol.model, [1, 2], names="blocks.0.hook_resid_post").names == ["blocks.0.hook_resid_post", "logits"]


# --------------------------------------------------------------------------- text that is not text
@pytest.mark.parametrize("text, needle", [("ab\udcffc", "byte 0xff"), ("\udc80", "byte 0x80"),
                                          ("x\ud800y", "U+D800"), ("\udfff", "U+DFFF")])
def test_invalid_text_cli_and_api(smol, previous, capsys, text, needle):
    with pytest.raises(PromptError, match=re.escape(needle)):
        smol.tokenizer.encode_prompt(text)
    with pytest.raises(PromptError, match=re.escape(needle)):
        smol.tokenizer.encode(text)  # the plain API refuses it too, with the same line
    for args in (["tokenize", "smollm2", "--text", text],
                 ["record", "smollm2", "--prompt", text, "--out", str(previous)],
                 ["generate", "smollm2", "--prompt", text]):
        one_line(cli.main(args), capsys.readouterr().err, "not valid UTF-8", needle)
    untouched(previous)


def test_invalid_utf8_in_real_argv(tmp_path):
    r = run([b"tokenize", b"smollm2", b"--text", b"caf\xe9 \xff"])
    one_line(r.returncode, r.stderr.decode(), "byte 0xe9")
    r = run([b"info", b"m\xff\n.gguf"])  # a path that is not UTF-8 and holds a newline: still one line
    one_line(r.returncode, r.stderr.decode(), "m\\xff\\n.gguf", "no such file")


@pytest.mark.parametrize("source, needle", [("~nosuchuser/m.gguf", "no such user"), ("\ud800.gguf", "\\ud800"),
                                            ("a\nb.gguf", "a\\nb.gguf"), ("\udcfe/x", "\\xfe/x")])
def test_unusable_paths_api_and_cli(capsys, source, needle):
    with pytest.raises(LoadError) as e:
        load(source)
    assert needle in str(e.value) and "\n" not in str(e.value)
    str(e.value).encode("utf-8")  # printable anywhere, no second error while reporting the first
    one_line(cli.main(["info", source]), capsys.readouterr().err, needle)


def test_out_under_a_missing_user(capsys):
    one_line(cli.main(["record", "smollm2", "--prompt", "hi", "--out", "~nosuchuser/r.npz"]),
             capsys.readouterr().err, "~nosuchuser")


# --------------------------------------------------------------------------- prompt size in characters
def test_prompt_character_bound(smol, previous, capsys):
    over = "a" * (MAX_PROMPT_CHARS + 1)
    assert check_prompt("a" * MAX_PROMPT_CHARS) == "a" * MAX_PROMPT_CHARS
    for text in (over, "word " * (MAX_PROMPT_CHARS // 2), "中" * (10 * MAX_PROMPT_CHARS)):
        with pytest.raises(PromptError, match=f"limit of {MAX_PROMPT_CHARS:,}"):
            smol.tokenizer.encode_prompt(text)
    with pytest.raises(PromptError, match="limit of 10"):
        check_prompt("x" * 11, limit=10)
    for args in (["tokenize", "smollm2", "--text", over], ["record", "smollm2", "--prompt", over, "--out", str(previous)],
                 ["generate", "smollm2", "--prompt", over], ["record", "smollm2", "--prompt", "hi", "--out",
                                                             str(previous), "--ablate", "blocks.0.attn.head1",
                                                             "--intervene", "patch:blocks.1.hook_resid_pre@0",
                                                             "--patch-source", over]):
        one_line(cli.main(args), capsys.readouterr().err, f"{len(over):,} characters", f"{MAX_PROMPT_CHARS:,}")
    untouched(previous)


# --------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("flag, value, needle", [
    ("--temperature", "nan", "--temperature"), ("--temperature", "inf", "--temperature"),
    ("--temperature", "-1", "--temperature"), ("--temperature", "5e-324", "--temperature"),
    ("--temperature", "1e-300", "--temperature"), ("--seed", str(2**64), "--seed"), ("--seed", str(10**30), "--seed"),
    ("--seed", "-1", "--seed"), ("--top-p", "nan", "top-p"), ("--top-k", "-3", "top-k"),
    ("--threads", "0", "--threads"), ("--threads", "-2", "--threads"), ("--threads", "100000", "--threads"),
])
def test_generate_numbers(capsys, flag, value, needle):
    extra = ["--temperature", "0.8"] if flag == "--seed" else []
    one_line(cli.main(["generate", "smollm2", "--prompt", "hi", flag, value, *extra]), capsys.readouterr().err, needle)


def test_largest_seed_and_smallest_temperature_are_accepted(capsys):
    assert cli.main(["generate", "smollm2", "--prompt", "hi", "--max-new-tokens", "2", "--temperature",
                     str(cli.MIN_TEMPERATURE), "--seed", str(2**64 - 1)]) == 0


# --------------------------------------------------------------------------- closed stdout
@pytest.mark.parametrize("args", [["tokenize", "smollm2", "--text", "hello world " * 3000],
                                  ["info", "smollm2"]])
def test_closed_stdout(args):
    p = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    p.stdout.readline()  # `| head -1`
    p.stdout.close()
    err = p.stderr.read().decode()
    code = p.wait(timeout=120)
    if args[0] == "info" and not err:  # all of it fitted in the pipe before it closed: nothing to report
        assert code == 0
        return
    one_line(code, err, "broken pipe")


# --------------------------------------------------------------------------- out of memory
@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 145000000000 bytes."),
                                   RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), MemoryError()])
def test_out_of_memory_is_one_line(monkeypatch, previous, capsys, error):
    import explorer_model.recording as recording

    def boom(*a, **k):
        raise error

    monkeypatch.setattr(recording, "record", boom)
    one_line(cli.main(["record", "smollm2", "--prompt", "hi", "--out", str(previous)]), capsys.readouterr().err,
             "out of memory")
    untouched(previous)


def test_other_runtime_errors_are_one_line_too(monkeypatch, capsys):
    import explorer_model.generate.sampling as sampling

    monkeypatch.setattr(sampling, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape '[1, -1]'")))
    line = one_line(cli.main(["generate", "smollm2", "--prompt", "hi"]), capsys.readouterr().err, "RuntimeError")
    assert "LLAMA_EXPLORER_DEBUG" in line


# --------------------------------------------------------------------------- --out and the streamed .npz
@pytest.mark.parametrize("target, needle", [(lambda d: d, "is a folder"), (lambda d: "/dev/full", "not a regular"),
                                            (lambda d: "/dev/null", "not a regular"),
                                            (lambda d: d / "no" / "r.npz", "does not exist"),
                                            (lambda d: "/proc/r.npz", "the folder /proc takes no new files")])
def test_out_that_is_not_a_file(tmp_path, capsys, target, needle):
    before = sorted(tmp_path.rglob("*"))
    code = cli.main(["record", "smollm2", "--prompt", "hi", "--names", "hook_embed", "--out", str(target(tmp_path))])
    one_line(code, capsys.readouterr().err, needle)
    assert sorted(tmp_path.rglob("*")) == before and not os.path.exists("/dev/full.npz")


def test_exact_name_is_written_and_named(tmp_path, capsys):
    out = tmp_path / "r.data"
    assert cli.main(["record", "smollm2", "--prompt", "hi there", "--names", "hook_embed", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1].endswith(f"to {out}") and "will take" in printed
    assert [p.name for p in tmp_path.iterdir()] == ["r.data"]
    assert set(np.load(out).files) == {"hook_embed", "logits", "token_ids", "about"}


def test_sizes_read_as_people_read_them():
    from explorer_model.memory import size_text

    assert [size_text(n) for n in (0, 700, 50_000, 3 << 20, 1 << 30)] == ["0 KiB", "1 KiB", "49 KiB", "3 MiB", "1.0 GiB"]


def test_streamed_npz_equals_savez_and_the_plan(smol, tmp_path):
    from explorer_model.recording import record

    ids = smol.tokenizer.encode("The capital of France is Paris, and")
    for names, dtype in ((None, torch.float32), (["blocks.3.attn.*", "blocks.*.ln1.hook_scale"], torch.float16),
                         (["blocks.1.*"], torch.bfloat16)):  # (bfloat16 is written as float32)
        rec = record(smol.model, ids, names=names, dtype=dtype)
        written = export.save_npz(rec, tmp_path / "s.npz")
        np.savez(tmp_path / "ref.npz", **rec.to_numpy())
        got, ref = np.load(written), np.load(tmp_path / "ref.npz")
        assert sorted(got.files) == sorted(ref.files)
        assert all(np.array_equal(got[k], ref[k]) and got[k].dtype == ref[k].dtype for k in ref.files)
        plan = export.plan(smol.model, ids, names, dtype)  # predicted from the shapes, before any run
        assert plan.file_bytes == sum(ref[k].nbytes for k in ref.files)
        assert plan.file_bytes <= written.stat().st_size < plan.file_bytes * 1.1 + 200_000


def test_plan_grows_with_the_square_of_the_prompt_for_patterns(smol):
    p1 = export.plan(smol.model, [1] * 100, ["blocks.0.attn.hook_pattern"], torch.float32)
    p2 = export.plan(smol.model, [1] * 1000, ["blocks.0.attn.hook_pattern"], torch.float32)
    pattern = lambda n: 9 * n * n * 4  # heads x pos x pos float32
    logits = lambda n: n * 49152 * 4
    assert p1.file_bytes == pattern(100) + logits(100) + 100 * 8
    assert p2.file_bytes == pattern(1000) + logits(1000) + 1000 * 8


@pytest.mark.parametrize("patch, needle", [("disk_usage", "free on that disk"), ("available_memory", "of memory")])
def test_recording_that_does_not_fit_is_refused_before_running(monkeypatch, previous, capsys, patch, needle):
    import collections

    import explorer_model.recording as recording

    if patch == "disk_usage":
        monkeypatch.setattr(export.shutil, "disk_usage",
                            lambda p: collections.namedtuple("U", "total used free")(10**6, 10**6 - 1000, 1000))
    else:
        monkeypatch.setattr(export, "available_memory", lambda: 1000)
    runs = []
    real = recording.record
    monkeypatch.setattr(recording, "record", lambda *a, **k: runs.append(len(a[1])) or real(*a, **k))
    one_line(cli.main(["record", "smollm2", "--prompt", "a prompt of a few tokens", "--out", str(previous)]),
             capsys.readouterr().err, needle, "--names")
    untouched(previous)
    assert runs == [], "the model ran before the refusal"


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EFBIG, errno.EIO])
def test_failed_write_keeps_the_previous_file(monkeypatch, previous, capsys, err):
    calls = []
    real = np.lib.format.write_array

    def fail_midway(f, arr, **k):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(err, os.strerror(err))
        return real(f, arr, **k)

    monkeypatch.setattr(np.lib.format, "write_array", fail_midway)
    one_line(cli.main(["record", "smollm2", "--prompt", "hi", "--out", str(previous)]), capsys.readouterr().err,
             "cannot write", str(previous), os.strerror(err))
    untouched(previous)


def test_file_size_limit_keeps_the_previous_file(previous):
    """ulimit -f: the kernel's SIGXFSZ would kill the process mid-write; the write fails cleanly instead."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    r = subprocess.run([sys.executable, "-m", "explorer_model.cli", "record", "smollm2", "--prompt", "hello world",
                        "--out", str(previous)], capture_output=True, text=True, env=ENV, timeout=180,
                       preexec_fn=limit)
    one_line(r.returncode, r.stderr, "cannot write", "too large")
    untouched(previous)


# --------------------------------------------------------------------------- every numeric argument
BAD_NUMBERS = [["serve", "--port", "99999"], ["serve", "--port", "-1"], ["serve", "--port", "0"],
               ["serve", "--max-tokens", "-5"], ["serve", "--max-tokens", "0"], ["serve", "--cache-mb", "0"],
               ["serve", "--cache-mb", "nan"], ["serve", "--processes", "0"], ["serve", "--processes", "10**9"],
               ["generate", "tiny-pre", "--prompt", "a", "--max-new-tokens", "1000000000000"],
               ["generate", "tiny-pre", "--prompt", "a", "--top-k", "-1"],
               ["train-tiny", "--norm", "pre", "--steps", "-1"], ["train-tiny", "--norm", "pre", "--lr", "nan"],
               ["train-tiny", "--norm", "pre", "--lr", "inf"], ["train-tiny", "--norm", "pre", "--layers", "0"],
               ["train-tiny", "--norm", "pre", "--batch", "99999999999"],
               ["train-tiny", "--norm", "pre", "--threads", "0"], ["train-tiny", "--norm", "pre", "--warmup", "-3"]]


def refused_before_starting(args, *needles):
    """In its own process (a server that starts anyway must not outlive the test): one line, exit 2, promptly."""
    proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        pytest.fail(f"{args} started instead of being refused")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    one_line(proc.returncode, err.decode(), *needles)
    assert b"open http" not in out


@pytest.mark.parametrize("args", BAD_NUMBERS, ids=" ".join)
def test_every_numeric_argument_is_checked(args):
    refused_before_starting(args, args[-2])


def test_serve_on_a_port_in_use():
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        refused_before_starting(["serve", "--port", str(held.getsockname()[1])], "in use")


# --------------------------------------------------------------------------- outside text is printed escaped
def test_control_characters_from_files_and_arguments_are_escaped(tmp_path, capsys):
    import gguf

    from checkpoints import hf_model, write_gguf

    evil = "\x1b[2J\x1b]0;owned\x07\nfake line\x9b"
    add_name = gguf.GGUFWriter.add_name
    gguf.GGUFWriter.add_name = lambda self, _name: add_name(self, evil)
    try:  # in the file's general.name, and in its file name, which names the model
        path = write_gguf(hf_model("gqa"), tmp_path / f"m{evil}.gguf")
    finally:
        gguf.GGUFWriter.add_name = add_name
    out = tmp_path / "r\x1b[31m\nx.npz"
    said = {}
    for args in (["info", str(path)], ["info", str(path), "--json"],
                 ["record", str(path), "--prompt", "hi", "--names", "hook_embed", "--out", str(out)],
                 ["record", str(path), "--prompt", "hi", "--out", str(tmp_path / "no\x1b[2J" / "r.npz")]):
        cli.main(args)  # in this process: the command writes through the same sys.stdout and sys.stderr
        r = said[" ".join(args[:1] + args[2:])] = capsys.readouterr()
        text = r.out + r.err
        assert not set(text) & {"\x1b", "\x07", "\x9b"}, (args, text)
        assert "fake line" not in text.splitlines() and "x.npz" not in text.splitlines(), text
    assert "\\x1b[2J" in said["info"].out  # escaped, not dropped


# --------------------------------------------------------------------------- links, signals and stale temporaries
def test_out_through_a_link_to_stdout_is_refused(tmp_path):
    link = tmp_path / "out.npz"
    link.symlink_to("/proc/self/fd/1")
    with open(tmp_path / "f.npz", "wb") as f:
        r = subprocess.run([sys.executable, "-m", "explorer_model.cli", "record", "tiny-pre", "--prompt", "hi",
                            "--out", str(link)], stdout=f, stderr=subprocess.PIPE, env=ENV, timeout=180)
    one_line(r.returncode, r.stderr.decode(), "stream")
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_out_through_a_link_to_a_file_writes_the_file(tmp_path, capsys):
    real = tmp_path / "real.npz"
    real.write_bytes(b"old")
    link = tmp_path / "link.npz"
    link.symlink_to(real)
    assert cli.main(["record", "tiny-pre", "--prompt", "hi", "--names", "hook_embed", "--out", str(link)]) == 0
    assert link.is_symlink() and "hook_embed" in np.load(real).files


@pytest.mark.parametrize("sig", [15, 1], ids=["SIGTERM", "SIGHUP"])
def test_signal_during_record_leaves_no_temporary(tmp_path, sig):
    out = tmp_path / "r.npz"
    ids = ",".join(str(10 + i % 900) for i in range(400))
    proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "record", "smollm2", "--token-ids", ids,
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        import time

        deadline = time.time() + 240
        while not list(tmp_path.glob(".r.npz.*.tmp")):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.005)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


@pytest.mark.parametrize("sig", [15, 1], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_whose_cleanup_raises_still_reports_the_signal(tmp_path, capsys, sig):
    """The signal can land inside a library's own cleanup (zipfile closing a member while unwinding), which then
    raises its own error in place of the Stopped the handler raised: the command still ends as the signal would
    end it, with no error line and no temporary."""
    import signal
    import types
    import zipfile

    def command(_args):
        with export.atomic_file(tmp_path / "r.npz") as tmp, zipfile.ZipFile(tmp, "w") as zf:
            member = zf.open("a.npy", "w")
            member.write(b"x" * 1000)
            os.kill(os.getpid(), sig)  # Stopped is raised here; ZipFile's exit then refuses the open member
        return 0

    before = signal.getsignal(sig)
    assert cli._run(types.SimpleNamespace(fn=command)) == 128 + sig
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err == ""
    assert signal.getsignal(sig) == before  # the handler is put back


def test_stale_temporaries_of_dead_writers_are_swept(tmp_path, capsys):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = tmp_path / f".r.npz.{dead.pid}.tmp", tmp_path / f".r.npz.{os.getppid()}.tmp"  # a live writer
    other = tmp_path / f".other.npz.{dead.pid}.tmp"  # another file's: not this run's business
    for f in (stale, live, other):
        f.write_bytes(b"half a recording")
    assert cli.main(["record", "tiny-pre", "--prompt", "hi", "--names", "hook_embed",
                     "--out", str(tmp_path / "r.npz")]) == 0
    assert not stale.exists() and live.exists() and other.exists()
