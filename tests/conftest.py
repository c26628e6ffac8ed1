"""pytest's side of the suite: the shared fixtures (the checkpoint writers of checkpoints.py as `ckpt`, the real
model, one thread), the guard against hangs, the tiers' markers, and the machine line."""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import signal
import sys
import types

import pytest
import torch

import checkpoints  # tests/ is on the path (pytest puts the rootdir conftest's folder there)
from machine_info import kernels_header, machine_lines
from module_order import longest_first

# A message key missing from a catalog raises in tests instead of showing the key (app/i18n.py).
os.environ.setdefault("LLAMA_EXPLORER_STRICT_I18N", "1")


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def ckpt():
    """checkpoints.py's helpers, for tests: `ckpt.hf_model(...)`, `ckpt.write_gguf(...)`, ..."""
    return types.SimpleNamespace(**{k: v for k, v in vars(checkpoints).items() if not k.startswith("_")})


@pytest.fixture(scope="module")
def gqa(ckpt):
    """One random GQA model (seed 7), random tokens and the model's logits on them from transformers."""
    model = ckpt.hf_model("gqa", seed=7)
    tokens = ckpt.random_tokens()
    return model, tokens, ckpt.hf_logits(model, tokens)


@pytest.fixture(scope="module")
def loaded():
    """The real default model (SmolLM2), loaded once per test module that asks for it."""
    from explorer_model.loaders import load
    return load("smollm2")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny CPU runs: OpenMP's second thread mostly waits, a lot on a busy machine. Through the project's one
    thread-count helper; this test process plays no server."""
    from explorer_model.lab.variants import threads
    with threads(1):
        yield


# --------------------------------------------------------------------------- hangs
@contextlib.contextmanager
def no_hang(seconds: int):
    """Fail (instead of hanging the suite) when the block takes longer than `seconds`: a guard against work
    that never ends, e.g. building 10^9 layers. Speed itself is measured in bench/, never asserted in tests."""
    def alarm(*_):
        raise TimeoutError(f"still running after {seconds} s: it hangs")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- test tiers
# `make test-fast` runs what needs neither the real model nor the app, a browser or a server:
#   -m "not real and not app and not browser and not slow and not trains"
# A test is marked `real` when it (or a fixture it uses) loads the default SmolLM2 GGUF, and `app` when its module
# drives the Streamlit app (AppTest, a server, the load bench). Marks can also be set by hand.
_REAL = re.compile(r"smollm2|default_gguf_path|DEFAULT_SOURCE")
_APP = re.compile(r"^from (apptest_util|streamlit\.testing)|^import apptest_util|bench_load", re.M)


@functools.lru_cache(maxsize=None)  # a module's source, read once for all of its tests
def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def pytest_configure(config):
    """A test process runs on one torch thread, or on n with LLAMA_EXPLORER_TEST_THREADS=n (torch 2.13 caps
    OMP_NUM_THREADS at the cores it sees, so the kernel matrix, test_kernel_matrix.py, asks for 4 threads on a
    2-core machine this way). The servers and CLIs the tests start take the same count through OMP_NUM_THREADS,
    unless it is set already. One thread, because `make test` runs three workers, their browsers and servers on
    the cores there are: two threads per process spent a third more CPU on the same tests (most of it waiting for
    each other), and the suite's wall time is its CPU time shared by the cores. The kernel matrix reruns the
    kernel-sensitive tests on 2 and 4 threads. A test process only: a server never changes its thread count after
    start."""
    wanted = os.environ.get("LLAMA_EXPLORER_TEST_THREADS", "1")
    torch.set_num_threads(int(wanted))
    os.environ.setdefault("OMP_NUM_THREADS", wanted)
    if not hasattr(config, "workerinput"):
        machine_lines()  # the speed probe and the load before any test runs


def pytest_runtest_setup(item):
    """Before a test that needs neither, the Chromium and the app server the browser modules share are stopped
    (browser_util.py): Playwright's event loop holds the thread, where the test's asyncio.run would fail, and an
    idle server holds a model's memory. The browser modules go first (tests/module_order.py)."""
    shared = sys.modules.get("browser_util")
    if shared is not None:
        if "browser" not in item.fixturenames:
            shared.stop_browser()
        if "server" not in item.fixturenames:
            shared.stop_server()


def pytest_sessionfinish(session):
    shared = sys.modules.get("browser_util")
    if shared is not None:
        shared.stop_browser()
        shared.stop_server()


def pytest_report_header(config):
    """The machine this run is on: kernels, and a Python speed probe to scale the suite's time by (a slow
    2-vCPU Xeon takes 1.1-1.5 s for it)."""
    return [kernels_header(), *machine_lines()]


def pytest_terminal_summary(terminalreporter):
    """The machine line again under the results, where `pytest -q` (make test) shows it too."""
    if not getattr(terminalreporter.config, "workerinput", None):
        for line in machine_lines():
            terminalreporter.write_line(line)


@functools.lru_cache(maxsize=None)
def _code_words(code: types.CodeType) -> str:
    """The names, argument names and string constants of a function's code and of the code nested in it: what
    _REAL looks for, read from the compiled function (reading each function's source costs ~1 s per collection)."""
    words, consts = [*code.co_names, *code.co_varnames], list(code.co_consts)
    while consts:
        c = consts.pop()
        if isinstance(c, (tuple, frozenset)):  # a literal list of constants is one tuple constant
            consts.extend(c)
        elif isinstance(c, (str, bytes)):
            words.append(c if isinstance(c, str) else c.decode("latin-1"))
        elif isinstance(c, types.CodeType):
            words.append(_code_words(c))
    return " ".join(words)


def _words(func) -> str:
    code = getattr(inspect.unwrap(func), "__code__", None)
    return _code_words(code) if code is not None else ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        params = repr(item.callspec.params) if hasattr(item, "callspec") else ""  # e.g. a CLI's arguments
        if _REAL.search(params) or any(_REAL.search(_words(f)) for f in [item.function, *fixtures]):
            item.add_marker(pytest.mark.real)
        if _APP.search(_source(item.module)):
            item.add_marker(pytest.mark.app)
    longest_first(items)
