"""The load bench's server side: starting, watching and stopping the app's server live in explorer_model/cli/loadtest.py
(`llama-explorer classroom-check` uses them too); the benches import them from here."""
from explorer_model.cli.loadtest import (CpuMeter, MemorySampler, cpu_seconds, free_port, memory_kb,  # noqa: F401
                                     start_server, stop_server, tree_pids, wait_healthy)
