"""The line every benchmark prints first: which machine its figures were taken on.

Figures from one machine do not carry over to another of the same kind (Python speed and the BLAS kernels that
run differ 2-5x), so each report names the CPU, the cores this process may use, torch's threads and CPU
capability, a Python speed probe and the load average at the start.
"""
from __future__ import annotations

import os
import platform
import time


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def python_probe() -> float:
    """Seconds for `sum(i*i for i in range(10**7))`: the speed of plain Python on this machine (1.1-1.5 s on a
    slow 2-vCPU Xeon, ~0.5 s on a fast desktop core)."""
    t0 = time.perf_counter()
    sum(i * i for i in range(10**7))
    return time.perf_counter() - t0


def machine_facts(probe: bool = True) -> dict:
    facts = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load": round(os.getloadavg()[0], 2),
    }
    try:
        import torch

        facts["torch_threads"] = torch.get_num_threads()
        facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    if probe:
        facts["python_probe_s"] = round(python_probe(), 3)
    return facts


def machine_line(probe: bool = True) -> str:
    f = machine_facts(probe)
    parts = [f"machine: {f['cpu']}", f"{f['cores']} cores"]
    if "torch_threads" in f:
        parts.append(f"torch {f['torch_threads']} threads ({f['cpu_capability']})")
    if "python_probe_s" in f:
        parts.append(f"python probe {f['python_probe_s']:.2f} s")
    parts.append(f"load {f['load']:.2f}")
    return ", ".join(parts)


if __name__ == "__main__":
    print(machine_line())
