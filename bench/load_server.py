"""The load bench's server side (bench_load.py): start and stop the app's server (one process, or `serve
--processes N` behind HAProxy), and read its process tree's memory from /proc (peak RSS, sampled)."""
from __future__ import annotations

import os
import sys
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from explorer_model.serve import free_port  # noqa: E402,F401  (bench_load and bench_browser_step import it from here)


def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_kb(pids: list[int]) -> dict[str, int]:
    total = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in total:
                        total[k] += int(v.split()[0])
        except OSError:
            pass
    return total


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used so far, their waited-for children included: the work
    a server did, which unlike wall time does not depend on what else the machine runs."""
    ticks = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / CLOCK_TICKS


class CpuMeter:
    """Server CPU seconds of a process tree between two readings. A process of the tree that ends between them
    takes its CPU time along (unless its parent waited for it), so the tree is re-read at every sample and the
    largest figure each pid reached is kept."""

    def __init__(self, root: int):
        self.root, self.seen = root, {}

    def read(self) -> float:
        for p in tree_pids(self.root):
            self.seen[p] = max(self.seen.get(p, 0.0), cpu_seconds([p]))
        return sum(self.seen.values())


class MemorySampler(threading.Thread):
    """Peak RSS of a process tree, sampled from /proc."""

    def __init__(self, pids: list[int], every: float = 0.2):
        super().__init__(daemon=True)
        self.pids, self.every, self.samples = list(pids), every, 0
        self.cpu = [CpuMeter(p) for p in self.pids]  # read at each sample, so short-lived processes are counted
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self.last = dict(self.peak)
        self.history: list[int] = []  # VmRSS of every sample, kB
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.last = rss_kb([p for root in self.pids for p in tree_pids(root)])
            self.cpu_seconds()
            self.samples += 1
            self.history.append(self.last["VmRSS"])
            if self.last["VmRSS"] > self.peak["VmRSS"]:
                self.peak = self.last
            self._halt.wait(self.every)

    def cpu_seconds(self) -> float:
        return sum(m.read() for m in self.cpu)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def start_server(port: int, cache_mb: int | None, max_tokens: int | None, log_path: Path,
                 processes: int = 1, taskset: str = "") -> subprocess.Popen:
    """One shared server as `serve --share` runs it, or with processes > 1 the `serve --share --processes N` command
    itself (app servers behind HAProxy); in its own process group, so stopping it stops all of it. With `taskset`
    (a CPU list such as "0") the whole server is confined to those cores."""
    from explorer_model.serve import server_env, streamlit_command

    log = open(log_path, "wb")
    if processes > 1:
        cmd = [sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--processes", str(processes),
               "--port", str(port)] + (["--cache-mb", str(cache_mb)] if cache_mb else []) + \
              (["--max-tokens", str(max_tokens)] if max_tokens else [])
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    else:
        cmd, env = streamlit_command(port, "127.0.0.1"), server_env(share=True, max_tokens=max_tokens, cache_mb=cache_mb)
    if taskset:
        cmd = ["taskset", "-c", taskset] + cmd
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not become healthy")
