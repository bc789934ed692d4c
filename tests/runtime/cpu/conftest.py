"""Fixtures of the model tests."""

from __future__ import annotations

import pytest
from pagoda.runtime.cpu import qgemm


@pytest.fixture(scope="module")
def kernel() -> qgemm.QGemm:
    """The quantized GEMM (`qgemm`), or a skip where it cannot build or run."""
    k = qgemm.load()
    if k is None:
        pytest.skip("no C++ compiler or no AVX2 + FMA on this CPU")
    return k
