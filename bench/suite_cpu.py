"""Where a command's CPU time goes, by kind of process: run it, sample every process it starts (its descendants, read
from /proc twice a second), and sum each one's CPU seconds under its kind: Chromium, an app server (Streamlit,
`serve`), the load balancer, a compiler, a pytest worker or the command itself, or another Python process (a CLI
or a child pytest). The test suite is the default command.

A process that starts and ends between two samples is missed, and one that ends is counted up to its last sample:
the "sampled" total is therefore a little below the CPU the operating system reports for the command's
descendants it waited for ("reaped", from getrusage), which is printed beside it.

With --top N, the N processes that took the most CPU follow, each with its kind and the start of its command line.

Usage: .venv/bin/python bench/suite_cpu.py [--every 0.5] [--top N] [-- COMMAND ...]
       (default command: python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder, as `make test`)
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, imported or run
from machine import machine_line  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
DEFAULT = [sys.executable, "-m", "pytest", "-q", "-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]
# (kind, words of its command line that tell it), first match wins
KINDS = (("chromium", (b"chromium", b"chrome")), ("app server", (b"streamlit", b"--server.port")),
         ("app server", (b"explorer_model.cli serve",)), ("load balancer", (b"haproxy",)),
         ("compiler", (b"cc1", b"gcc", b"/cc ", b"clang", b" ld ")),
         ("pytest worker", (b"execnet", b"xdist", b"exec(eval(")), ("python", (b"python",)))


def kind_of(cmdline: bytes) -> str:
    line = cmdline.replace(b"\0", b" ")
    return next((kind for kind, words in KINDS if any(w in line for w in words)), "other")


def processes() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, CPU ticks)} of every process now running."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended since the listing
                continue
            out[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return out


def descendants(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.5, help="seconds between two samples of /proc")
    ap.add_argument("--top", type=int, default=0, help="list the N processes that took the most CPU")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command to run (after --)")
    args = ap.parse_args()
    command = [c for c in args.command if c != "--"] or DEFAULT
    print(machine_line(), flush=True)
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as make's recipes run
    child = subprocess.Popen(command, cwd=ROOT, env=dict(env, OMP_WAIT_POLICY="PASSIVE"))
    seen: dict[int, list] = {}  # pid -> [kind, CPU ticks at its last sample, command line]
    while child.poll() is None:
        table = processes()
        for pid in descendants(child.pid, table):
            if pid not in seen:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                kind = "the command" if pid == child.pid else kind_of(cmdline)
                seen[pid] = [kind, 0, cmdline.replace(b"\0", b" ").decode(errors="replace").strip()]
            seen[pid][1] = table[pid][1]
        time.sleep(args.every)
    wall = time.monotonic() - t0
    by_kind: dict[str, float] = {}
    for kind, ticks, _ in seen.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + ticks / TICK
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampled = sum(by_kind.values())
    print(f"exit status {child.returncode}; {wall:.0f} s wall; CPU sampled {sampled:.0f} s, reaped "
          f"{usage.ru_utime + usage.ru_stime:.0f} s; {len(seen)} processes sampled")
    for kind, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:<14} {seconds:8.1f} s CPU  {100 * seconds / max(sampled, 1e-9):5.1f} %")
    if args.top:
        print(f"the {args.top} processes that took the most CPU:")
        for kind, ticks, cmdline in sorted(seen.values(), key=lambda v: -v[1])[:args.top]:
            print(f"  {ticks / TICK:7.1f} s  {kind:<14} {cmdline[:150]}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
