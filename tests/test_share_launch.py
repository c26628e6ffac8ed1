"""`serve --share` talks to nobody outside this machine, and prints addresses students can reach.

The server runs in subprocesses whose every socket connect and name lookup is recorded by an audit hook
(sitecustomize on PYTHONPATH, so the CLI process and the Streamlit process it starts are both watched).
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from explorer_model.cli.serve import free_port

ROOT = Path(__file__).resolve().parents[1]

HOOK = textwrap.dedent("""
    import os, sys
    _LOG = os.environ["OUTBOUND_LOG"]
    _LOCAL = {None, "", "localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}

    def _note(kind, target):
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {kind} {target!r}\\n")

    def _hook(event, args):
        if event == "socket.connect":
            addr = args[1]
            if isinstance(addr, tuple) and addr and str(addr[0]) not in _LOCAL and not str(addr[0]).startswith("127."):
                _note("connect", addr)
        elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
            host = args[0]
            host = host.decode() if isinstance(host, bytes) else host
            if host not in _LOCAL and not str(host).startswith("127."):
                _note(event, host)

    sys.addaudithook(_hook)
""")


def foreign_origin_websocket(port: int) -> bytes:
    """A WebSocket upgrade from another site's page: Streamlit's origin check would look up the external IP."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall((f"GET /_stcore/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   "Sec-WebSocket-Version: 13\r\nOrigin: http://evil.example\r\n\r\n").encode())
        return s.recv(200)


def test_share_mode_makes_no_outbound_connection(tmp_path):
    from explorer_model.cli.serve import lan_addresses

    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    log = tmp_path / "outbound.log"
    log.write_text("")
    port = free_port()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OUTBOUND_LOG=str(log), XDG_RUNTIME_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "hook"), str(ROOT)]))  # (the room's folder in tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "explorer_model.cli", "serve", "--share", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the server did not start")
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200
        reply = foreign_origin_websocket(port)
        assert reply.startswith(b"HTTP/1.1"), reply
        time.sleep(2)  # a lookup started by the banner or the origin check takes up to a second to be made
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out = proc.communicate(timeout=15)[0].decode(errors="replace")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0].decode(errors="replace")
    assert log.read_text() == "", log.read_text()
    # the addresses printed for students are this machine's interfaces, never loopback when there are others
    printed = [l.split("http://")[1].split(":")[0] for l in out.splitlines() if l.startswith("LLaMA Explorer: open")]
    expected = lan_addresses() or ["127.0.0.1"]
    assert printed == expected, out
    assert "External URL" not in out


def test_the_hook_sees_an_outbound_connection(tmp_path):
    """The recorder above is not blind: the same hook logs a connection attempt to a public address."""
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    log = tmp_path / "outbound.log"
    code = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('8.8.8.8', 1)); "
            "s.close()")  # UDP: the connect only picks a route, no packet leaves
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OUTBOUND_LOG=str(log), PYTHONPATH=str(tmp_path)),
                   check=True)
    assert "8.8.8.8" in log.read_text()


def test_lan_addresses_are_interfaces_not_loopback():
    from explorer_model.cli.serve import lan_addresses

    addrs = lan_addresses()
    assert all(not a.startswith("127.") for a in addrs)
    for a in addrs:  # each is bound to an interface of this machine: a socket can bind to it
        with socket.socket() as s:
            s.bind((a, 0))
