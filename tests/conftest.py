"""Shared test settings: keep torch to the machine's cores and make e2e tool checks strict in CI."""

import os

# Before torch loads libgomp (as `pagoda serve` and `pagoda tune` do): OpenMP threads that spin
# at barriers while another process holds a core make each small op a scheduler time slice
# slower. On 2 busy cores a tiny-model engine step took 96-209 ms with spinning threads and
# 5-6 ms with passive ones; the suite's processes (pytest, its servers) compete for 2 cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Under pytest-xdist (`make test-fast` runs one worker per core) each worker keeps to one thread,
# so the workers share the cores instead of each asking for all of them.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))

REQUIRE_E2E = os.environ.get("PAGODA_REQUIRE_E2E") == "1"


def skip_or_fail(reason: str) -> None:
    """Skip locally when a tool is missing; fail in CI, where .ci/run installs everything."""
    if REQUIRE_E2E:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


# Slow tests that share the cores well (no timing bounds, no servers of their own): `make test`
# runs them on the xdist workers; every other slow test is marked `serial` and runs alone after.
SLOW_IN_PARALLEL = (
    "tests/benchmarks/",
    "tests/kernels/test_kernel_invariance.py",
    "tests/runtime/cpu/test_cpu_attention.py",
    "tests/runtime/engine/test_async_scheduling.py",
    "tests/runtime/engine/test_differential.py",
    "tests/runtime/engine/test_invariance.py",
    "tests/runtime/model/test_gguf.py",
    "tests/runtime/test_correctness_hf.py",
    "tests/runtime/tune/test_moe_sweep.py",
    "tests/runtime/tune/test_tune_interpreter.py",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(config, items):
    serial = pytest.mark.serial
    for item in items:
        if "slow" in item.keywords and not item.nodeid.startswith(SLOW_IN_PARALLEL):
            item.add_marker(serial)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
