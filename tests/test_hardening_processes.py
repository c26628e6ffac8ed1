"""`serve` and the processes it starts: a signal to `serve` (SIGTERM, SIGHUP, SIGINT, even SIGKILL) stops every
server it started, its exit status says what happened, and with `--processes 2` a backend killed with SIGKILL is
restarted while HAProxy keeps the room answering from the other one. Every process a test starts is killed in a
`finally`; everything listens on loopback."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from explorer_model.cli.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.app


def health(port: int, timeout: float = 5, failures: list | None = None) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=timeout).read() == b"ok"
    except OSError as e:
        if failures is not None:
            failures.append(f"{type(e).__name__}: {e}")
        return False


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except (OSError, IndexError):
        return False


def wait_for(condition, seconds: float, what: str) -> None:
    end = time.time() + seconds
    while not condition():
        if time.time() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


class Serve:
    """`llama-explorer serve ARGS` on a free loopback port, its output in a file."""

    def __init__(self, *args: str, env: dict | None = None):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="serve-", suffix=".log")
        self.proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "serve", "--port", str(self.port),
                                      *args], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **(env or {})),
                                     start_new_session=True)
        self.seen: set[int] = set()

    def started(self, n: int) -> list[int]:
        wait_for(lambda: health(self.port) or self.proc.poll() is not None, 180, "the server")
        assert self.proc.poll() is None, self.output()
        kids = children(self.proc.pid)
        assert len(kids) == n, kids
        self.seen.update(kids)
        return kids

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def close(self) -> None:
        with_group = [self.proc.pid]
        for pid in self.seen | set(children(self.proc.pid)):
            with_group.append(pid)
        for pid in with_group:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


@pytest.fixture
def serve(tmp_path):
    """`serve` with TMPDIR in the test's folder: what a SIGKILL leaves of it (HAProxy's config folder) stays there."""
    started: list[Serve] = []

    def make(*args, env: dict | None = None) -> Serve:
        started.append(Serve(*args, env={"TMPDIR": str(tmp_path), **(env or {})}))
        return started[-1]
    try:
        yield make
    finally:
        for s in started:
            s.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_serve_stops_the_server_too(serve, sig):
    s = serve()
    (app,) = s.started(1)
    s.proc.send_signal(sig)
    s.proc.wait(60)
    assert s.proc.returncode == 128 + sig, s.output()
    wait_for(lambda: not running(app), 20, "the Streamlit process to stop")
    assert not health(s.port)


def test_sigkill_to_serve_leaves_no_orphan(serve):
    s = serve()
    (app,) = s.started(1)
    s.proc.kill()
    s.proc.wait(10)
    wait_for(lambda: not running(app), 20, "the orphaned Streamlit process to stop")


def test_a_server_that_fails_makes_serve_fail(serve, tmp_path):
    broken = tmp_path / "streamlit"  # the Streamlit the server would import exits at once with status 3
    broken.mkdir()
    (broken / "__init__.py").write_text("raise SystemExit(3)\n")
    s = serve(env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    s.proc.wait(120)
    lines = [l for l in s.output().splitlines() if l.startswith("llama-explorer:")]
    assert s.proc.returncode == 1 and len(lines) == 1 and "exit status 3" in lines[0], s.output()


@pytest.mark.skipif(not (shutil.which("haproxy") or Path("/usr/sbin/haproxy").exists()), reason="no HAProxy")
def test_a_killed_backend_is_restarted_and_the_room_stays_up(serve):
    s = serve("--processes", "2")
    kids = s.started(3)
    backends = [p for p in kids if b"--server.port" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(backends) == 2, kids
    victim = backends[0]
    args = Path(f"/proc/{victim}/cmdline").read_bytes().split(b"\0")
    victim_port = int(args[args.index(b"--server.port") + 1])
    os.kill(victim, signal.SIGKILL)
    end, answers, failures = time.time() + 10, [], []
    while time.time() < end:  # meanwhile the balancer answers from the healthy backend, every time (slowly, on a
        answers.append(health(s.port, 20, failures))  # machine this busy: a slow answer is still an answer)
        time.sleep(0.2)
    assert all(answers), f"{answers.count(False)} of {len(answers)} health checks failed: {failures}\n{s.output()}"
    assert s.proc.poll() is None and all(running(p) for p in kids if p != victim), s.output()
    wait_for(lambda: len(children(s.proc.pid)) == 3 and victim not in children(s.proc.pid), 20, "a new backend")
    wait_for(lambda: health(victim_port), 180, "the restarted backend")
    s.seen.update(children(s.proc.pid))
    assert "restarting it (1 in the last minute)" in s.output()
