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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
