"""The kernel-sensitive tests (marker `kernels`) rerun in subprocesses under other thread counts and the CPU
capabilities torch, oneDNN and MKL let a process lower, so an equality that holds on one CPU's kernels only fails
here too, not first on a user's machine.

The main run covers one thread (conftest.py) and this machine's best ISA; each configuration below is one
pytest process. Each child prints a header line with the threads and capability it really ran (conftest.py's
pytest_report_header), and the parent checks that line, so a setting that did not take effect fails instead of
passing as a rerun of the default.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOWERED_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def threads(n: int) -> dict[str, str]:
    """Both settings: OMP_NUM_THREADS for OpenMP and MKL, and the conftest's LLAMA_EXPLORER_TEST_THREADS for torch,
    which caps OMP_NUM_THREADS at the cores it sees (4 threads on a 2-core machine need the second)."""
    return {"OMP_NUM_THREADS": str(n), "LLAMA_EXPLORER_TEST_THREADS": str(n)}


# With the main run (`make test`: one torch thread per worker, this machine's best ISA): 1, 2 and 4 threads, and
# two lowered ISAs: AVX2 everywhere (torch, oneDNN and MKL lowered together) and baseline kernels (torch without
# SIMD dispatch, MKL on its compatible SSE2 path: on an AVX2-only CPU, where lowering to AVX2 changes nothing, this
# is the configuration whose matrix products split their sums differently). Each child is a whole pytest run, so
# one child covers a thread count and an ISA at once.
BASELINE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
CONFIGS = {
    "2-threads-avx2": ({**threads(2), **LOWERED_AVX2}, 2, "AVX2", None),
    "4-threads-baseline-kernels": ({**threads(4), **BASELINE}, 4, "DEFAULT", "COMPATIBLE"),
}
HEADER = re.compile(r"^kernels: torch (\d+) threads, capability ([^,\s]+), mkl branch (\S+)", re.M)
# The slow determinism test spawns server-like processes: once in the main run is enough.
SELECTION = "kernels and not slow"


def kernel_modules() -> list[str]:
    """The test files that hold `kernels` tests (collecting only these keeps each child short)."""
    return sorted(str(p) for p in (ROOT / "tests").glob("test_*.py")
                  if p.name != Path(__file__).name and "pytest.mark.kernels" in p.read_text(encoding="utf-8"))


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LLAMA_EXPLORER_TEST_THREADS", *LOWERED_AVX2, *BASELINE,
                        "PYTEST_ADDOPTS")}
    env.update(extra, OMP_WAIT_POLICY="PASSIVE", LLAMA_EXPLORER_NO_PROBE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.real
@pytest.mark.parametrize("config", CONFIGS)
def test_kernel_sensitive_tests_pass_under(config):
    extra, threads, capability, mkl = CONFIGS[config]
    run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider", "-m", SELECTION,
                          *kernel_modules()], cwd=ROOT, env=child_env(extra), capture_output=True, text=True,
                         timeout=900)
    out = run.stdout + run.stderr
    header = HEADER.search(out)
    assert header, out[-3000:]
    assert int(header.group(1)) == threads, header.group(0)
    if capability is not None:
        assert header.group(2) == capability, header.group(0)
    if mkl is not None and header.group(3) != "unknown":  # a torch without MKL: the setting has nothing to lower
        assert header.group(3) == mkl, header.group(0)
    assert run.returncode == 0, f"{config}:\n{out[-4000:]}"
    assert re.search(r"\b\d+ passed\b", out), out[-2000:]


def test_the_kernel_modules_are_the_ones_that_compare_kernels_results():
    assert [Path(p).name for p in kernel_modules()] == [
        "test_decode.py", "test_extend.py", "test_kernels.py", "test_load_short.py", "test_native_step.py",
        "test_parity_hf.py", "test_rebuilt_hooks.py", "test_twins.py"]


def test_the_header_pattern_reads_what_conftest_prints():
    from machine_info import kernels_header, mkl_branch

    line = kernels_header()
    match = HEADER.search(line)
    assert match, line
    import torch

    assert int(match.group(1)) == torch.get_num_threads()
    assert match.group(2) == torch.backends.cpu.get_cpu_capability()
    assert match.group(3) == mkl_branch()


@pytest.mark.slow  # child pytest processes
def test_the_header_reads_the_branch_mkl_cbwr_asks_for():
    """The baseline configuration's MKL setting is checked through the header: it must read what MKL took."""
    def branch(value: str | None) -> str:
        env = child_env({} if value is None else {"MKL_CBWR": value})
        code = "import sys; sys.path.insert(0, 'tests'); from machine_info import mkl_branch; print(mkl_branch())"
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120).stdout.strip()

    default = branch(None)
    if default == "unknown":
        pytest.skip("this torch has no MKL: MKL_CBWR lowers nothing")
    assert (default, branch("COMPATIBLE")) == ("off", "COMPATIBLE")
