"""What a test run says about where it ran: the machine (CPU model, cores, load, a Python speed probe to scale the
suite's time by) and the kernels torch takes (threads, CPU capability, MKL's branch), printed by tests/conftest.py
and read back by test_kernel_matrix.py from its children's output."""
from __future__ import annotations

import os


# MKL's code-path branch (mkl_service.h's MKL_CBWR_* values): what MKL_CBWR asked for, as MKL read it.
MKL_BRANCHES = {1: "off", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX",
                10: "AVX2", 12: "AVX512"}


def mkl_branch() -> str:
    """The code path MKL's conditional numerical reproducibility pins (MKL_CBWR), read from the MKL inside torch's
    CPU library; "unknown" where that library has no MKL (other platforms, other builds)."""
    import ctypes

    import torch

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        return MKL_BRANCHES.get(lib.mkl_serv_cbwr_get(1), "unknown")
    except (OSError, AttributeError):
        return "unknown"


def kernels_header() -> str:
    """Which kernels this run takes (read by test_kernel_matrix.py in its children's output)."""
    import torch

    return (f"kernels: torch {torch.get_num_threads()} threads, capability "
            f"{torch.backends.cpu.get_cpu_capability()}, mkl branch {mkl_branch()}")


_MACHINE: list[str] = []


def machine_lines() -> list[str]:
    """CPU model, cores and load, and the Python speed probe (measured once per process)."""
    if os.environ.get("LLAMA_EXPLORER_NO_PROBE"):
        return []
    if not _MACHINE:
        import platform
        import time

        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                      if line.startswith("model name")), platform.processor()) if os.path.exists("/proc/cpuinfo") \
            else platform.processor()
        t0 = time.perf_counter()
        sum(i * i for i in range(10**7))
        probe = time.perf_counter() - t0
        _MACHINE.append(f"machine: {model}, {os.cpu_count()} cores, load average at the start "
                        f"{os.getloadavg()[0]:.2f}; "
                        f"python speed probe: sum(i*i for i in range(10**7)) took {probe:.2f} s")
    return _MACHINE
