"""Start the Streamlit server the way a classroom needs it: local only, no telemetry, no CDN."""
from __future__ import annotations

import os
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
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
        "--theme.base", "light",
    ]


def serve(port: int = 8501, source: str = "smollm2") -> None:
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    query = "" if source == "smollm2" else f"?model={source}"
    print(f"LLaMA Explorer: open http://127.0.0.1:{port}/{query}  (Ctrl+C to stop)", flush=True)
    try:
        subprocess.run(streamlit_command(port), env=env, check=False)
    except KeyboardInterrupt:
        pass
