"""Start the Streamlit server the way a classroom needs it: no telemetry, no CDN, no outbound lookups, local unless
shared. The app (app/main.py) runs in the Streamlit subprocess; this module never imports it."""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..loaders import SERVED_ENV, list_name
from ..loaders.native import named_path
from ..printable import printable

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"  # run as a script: never imported here


# Streamlit looks up this machine's addresses by itself: a UDP connect towards 8.8.8.8 (the internal IP) and an
# HTTP GET to checkip.amazonaws.com (the external IP, for its banner and for the origin check of a cross-site
# WebSocket). A classroom server must not talk to the outside, and a crafted reply once crashed it at launch.
# browser.serverAddress stops the banner lookup; pinning both cached answers before Streamlit starts stops
# every other one (net_util returns a cached value when it is not None).
_NO_LOOKUPS = ("import streamlit.net_util as n, sys; n._external_ip = ''; n._internal_ip = sys.argv.pop(1); "
               "from streamlit.web.cli import main; main()")


def streamlit_command(port: int = 8501, address: str = "127.0.0.1", url_host: str | None = None) -> list[str]:
    """The server command; `url_host` is the address printed and trusted as the page's origin."""
    url_host = url_host or ("127.0.0.1" if address in ("0.0.0.0", "::") else address)
    return [
        sys.executable, "-c", _NO_LOOKUPS, url_host, "run", str(MAIN),
        "--server.address", address,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--browser.serverAddress", url_host,
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
        "--theme.base", "light",
        # Streamlit runs a full garbage collection after every page run, holding the GIL: ~0.2 s with a model
        # loaded, two thirds of the server's Python time with 30 visitors (py-spy, bench/bench_load.py). Python's
        # own generational collection still runs; the gateway freezes the objects that live as long as the model.
        "--runner.postScriptGC", "false",
        # The app sets a widget's starting value in session state before the widget (app/choice_state.py) and
        # gives the same value as the widget's default; Streamlit logs that, with a stack, as if it were an error.
        "--global.disableWidgetStateDuplicationWarning", "true",
        # The page's one upload is a lecture file of at most 256 KB (explorer_model/lecture.py): the server refuses
        # a body over 1 MB (its smallest limit; the default, 200 MB, is what the picker said and what one visitor
        # could make the server hold).
        "--server.maxUploadSize", "1",
    ]


HAPROXY_CFG = Path(__file__).resolve().parents[2] / "docs" / "haproxy.cfg"


def haproxy_config(front: int, backends: list[int], address: str = "127.0.0.1") -> str:
    """docs/haproxy.cfg listening on address:front with one `server` line per process port (docs/classroom.md: "Several
    processes"; bench/bench_load.py --processes and the room's browser test run it)."""
    text = re.sub(r"bind \S*:\d+", f"bind {address}:{front}", HAPROXY_CFG.read_text())
    head = text[:text.index("    server p1 ")]
    return head + "".join(f"    server p{i} 127.0.0.1:{port} check cookie p{i}\n" for i, port in enumerate(backends, 1))


def lan_addresses() -> list[str]:
    """IPv4 address of every non-loopback interface, read from the kernel (no DNS, no packet sent): the
    hostname often maps to 127.0.1.1 or 127.0.0.1, which is no use to students."""
    found = []
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR (Linux): the interface's IPv4 address
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                except OSError:  # no IPv4 address on this interface
                    continue
                addr = socket.inet_ntoa(packed[20:24])
                if not addr.startswith("127.") and addr not in found:
                    found.append(addr)
    except (ImportError, OSError, AttributeError):  # not Linux: nothing reliable without a lookup
        pass
    return found


def share_threads(cores: int, processes: int = 1) -> int:
    """Torch threads per process of a shared server: the cores left once each process keeps one for drawing
    pages, shared out, at least one. A process draws one page at a time (its interpreter lock) while the model
    runs in another thread; given every core, the model's threads fight the drawing for them, and the small tensor
    operations of a page (a softmax, a norm) pay for a thread team they do not need. On 2 cores, one thread per
    process halved the server's CPU per view switch and cut it by a fifth per action of a class of 30
    (docs/classroom.md). A user's own OMP_NUM_THREADS wins."""
    return max(1, (cores - processes) // processes)


def server_env(share: bool = False, models_dir: str | None = None, max_tokens: int | None = None,
               cache_mb: int | None = None, lab: bool = True, lecture: str | None = None,
               source: str = "smollm2") -> dict[str, str]:
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), LLAMA_EXPLORER_WARM_UP="1")
    env.pop(SERVED_ENV, None)
    if source != "smollm2":  # every new page opens it (app/gateway/settings.py: default_source); a path absolute,
        # as the server runs in the project's folder
        env[SERVED_ENV] = source if named_path(source) is not None and not Path(source).exists() else \
            str(Path(source).expanduser().resolve())
    if not lab:
        env["LLAMA_EXPLORER_LAB"] = "0"
    if share:
        env["LLAMA_EXPLORER_SHARE"] = "1"
        env.setdefault("OMP_NUM_THREADS", str(share_threads(os.cpu_count() or 1)))
    if models_dir:
        env["LLAMA_EXPLORER_MODELS_DIR"] = str(Path(models_dir).expanduser().resolve())
    if max_tokens:
        env["LLAMA_EXPLORER_MAX_TOKENS"] = str(max_tokens)
    if cache_mb:
        env["LLAMA_EXPLORER_CACHE_MB"] = str(cache_mb)
    if lecture:  # app/lecture_player.py opens it for every new visitor
        env["LLAMA_EXPLORER_LECTURE"] = str(Path(lecture).expanduser().resolve())
    return env


def room_env(port: int) -> dict[str, str]:
    """A shared server's room (explorer_model/room.py): its SQLite file in the server's runtime folder (kept across
    restarts) and a fresh secret key for the presenter's link."""
    import secrets

    from ..room import ROOM_DB_ENV, ROOM_KEY_ENV, runtime_dir

    return {ROOM_DB_ENV: str(runtime_dir(port) / "room.sqlite3"), ROOM_KEY_ENV: secrets.token_urlsafe(18)}


def serve(port: int = 8501, source: str = "smollm2", share: bool = False, models_dir: str | None = None,
          max_tokens: int | None = None, cache_mb: int | None = None, lab: bool = True, processes: int = 1,
          lecture: str | None = None) -> None:
    address = "0.0.0.0" if share else "127.0.0.1"
    hosts = (lan_addresses() if share else []) or ["127.0.0.1"]
    for host in hosts:
        print(f"LLaMA Explorer: open http://{host}:{port}/  (Ctrl+C to stop)", flush=True)
    env = server_env(share, models_dir, max_tokens, cache_mb, lab, lecture, source)
    if share:
        if hosts == ["127.0.0.1"]:
            print("No network interface with an address was found: only this machine can open the page.", flush=True)
        own = f"{printable(list_name(env[SERVED_ENV]))} (every new page opens it), " if SERVED_ENV in env else ""
        print(f"Shared mode: visitors choose from {own}the default model, the shipped teaching models"
              + (f" and the models in {printable(models_dir)}" if models_dir else "") + "; they cannot load paths.",
              flush=True)
        print("How many students this machine holds: `llama-explorer classroom-check` (about a minute, before the "
              "lesson).", flush=True)
    if share:
        env.update(room_env(port))
        print(f"Presenter link (keep it to yourself: it moves every student's page): "
              f"http://{hosts[0]}:{port}/?room_key={env['LLAMA_EXPLORER_ROOM_KEY']}&presenter=1", flush=True)
    if processes > 1:
        return serve_processes(port, address, hosts[0], env, processes)
    return supervise([streamlit_command(port, address, hosts[0])], [env], restart=False)


def port_is_free(address: str, port: int) -> None:
    """Raises OSError (EADDRINUSE, EACCES) when a server could not listen on address:port now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a TIME_WAIT port is free
        s.bind((address, port))


def _die_with_parent() -> None:
    """In a child, before it runs: Linux sends it SIGTERM when the process that started it dies, even by
    SIGKILL, so no server outlives `serve`. Elsewhere nothing is done (the signal handlers still stop it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start(command: list[str], env: dict | None) -> subprocess.Popen:
    return subprocess.Popen(command, env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None)


RESTARTS_PER_MINUTE = 5  # a backend that dies faster than this is broken, not unlucky: stop and say so


def say(line: str) -> None:
    print(f"llama-explorer: {printable(line)}", file=sys.stderr, flush=True)


def supervise(commands: list[list[str]], envs: list[dict | None], restart: bool) -> int:
    """Run every command until SIGTERM, SIGHUP or SIGINT, then stop them all and return 128 + the signal.
    With `restart`, a process that dies is started again (one line on stderr each time), at most
    RESTARTS_PER_MINUTE times a minute; without, or beyond that, everything stops and the status is 1."""
    procs = [start(c, e) for c, e in zip(commands, envs)]
    stopping: list[int] = []
    restarts: list[float] = []
    status = 0

    def stop(signum, _frame):
        stopping.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        while not stopping and not status:
            for i, p in enumerate(procs):
                code = p.poll()
                if code is None or stopping:
                    continue
                name = Path(commands[i][0]).name if commands[i][1:2] != ["-c"] else f"app server {i + 1}"
                restarts = [t for t in restarts if time.monotonic() - t < 60]
                if not restart or len(restarts) >= RESTARTS_PER_MINUTE:
                    say(f"error: {name} stopped with exit status {code}"
                        + (f" after {len(restarts)} restarts in a minute" if restart else ""))
                    status = 1
                    break
                restarts.append(time.monotonic())
                say(f"{name} stopped with exit status {code}; restarting it ({len(restarts)} in the last minute)")
                procs[i] = start(commands[i], envs[i])
            time.sleep(0.2)
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.terminate()
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + stopping[0] if stopping else status


def free_port() -> int:
    """A loopback port nobody listens on now (for `--processes`, the load bench and the browser tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy_path() -> str | None:
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    return exe if Path(exe).exists() else None


def serve_processes(port: int, address: str, url_host: str, env: dict, processes: int) -> int:
    """`serve --processes N`: N app servers on loopback ports, each with its own model, cache and lab worker and
    share_threads(cores, N) torch threads, behind HAProxy on address:port with docs/haproxy.cfg (a visitor stays with one
    process). One process has one GIL: a second one draws and runs the model beside it (docs/classroom.md, "Several
    processes"). A process that dies is restarted; HAProxy's health checks send visitors to the others meanwhile."""
    exe = haproxy_path()
    if exe is None:
        raise RuntimeError("--processes needs HAProxy (Debian: apt install haproxy)")
    ports = [free_port() for _ in range(processes)]
    each = dict(env, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS") or str(share_threads(os.cpu_count() or 1, processes)),
                LLAMA_EXPLORER_PUBLIC_PORT=str(port))  # the share box shows the balancer's port, not its own
    with tempfile.TemporaryDirectory(prefix="llama_explorer_haproxy_") as tmp:
        cfg = Path(tmp) / "haproxy.cfg"
        cfg.write_text(haproxy_config(port, ports, address))
        commands = [streamlit_command(p, "127.0.0.1", url_host) for p in ports] + [[exe, "-db", "-f", str(cfg)]]
        return supervise(commands, [each] * processes + [None], restart=True)
