"""Start the Streamlit server the way a classroom needs it: no telemetry, no CDN, local unless shared."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().parent / "main.py"


def streamlit_command(port: int = 8501, address: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable, "-m", "streamlit", "run", str(MAIN),
        "--server.address", address,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
        "--theme.base", "light",
    ]


def lan_address() -> str:
    """This machine's name on the room's network, for the URL students type."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def server_env(share: bool = False, models_dir: str | None = None, max_tokens: int | None = None,
               cache_mb: int | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    if share:
        env["LLAMA_EXPLORER_SHARE"] = "1"
    if models_dir:
        env["LLAMA_EXPLORER_MODELS_DIR"] = str(Path(models_dir).expanduser().resolve())
    if max_tokens:
        env["LLAMA_EXPLORER_MAX_TOKENS"] = str(max_tokens)
    if cache_mb:
        env["LLAMA_EXPLORER_CACHE_MB"] = str(cache_mb)
    return env


def serve(port: int = 8501, source: str = "smollm2", share: bool = False, models_dir: str | None = None,
          max_tokens: int | None = None, cache_mb: int | None = None) -> None:
    address = "0.0.0.0" if share else "127.0.0.1"
    query = "" if source == "smollm2" else f"?model={source}"
    host = lan_address() if share else "127.0.0.1"
    print(f"LLaMA Explorer: open http://{host}:{port}/{query}  (Ctrl+C to stop)", flush=True)
    if share:
        print("Shared mode: visitors choose from the default model, the shipped teaching models"
              + (f" and the models in {models_dir}" if models_dir else "") + "; they cannot load paths.", flush=True)
    try:
        subprocess.run(streamlit_command(port, address),
                       env=server_env(share, models_dir, max_tokens, cache_mb), check=False)
    except KeyboardInterrupt:
        pass
