"""Kernel tests run twice over: on the CPU through Triton's interpreter, and on CUDA when present.

``TRITON_INTERPRET`` must be set before Triton is imported (it is read when kernels are
decorated): default to the interpreter unless a CUDA device is there. The ``device`` fixture
yields "cpu" under the interpreter and "cuda" (marked ``gpu``) for compiled kernels; the other
one is skipped with its reason. On a GPU node: ``TRITON_INTERPRET=0 pytest -m gpu tests/kernels``.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest

INTERPRET = os.environ["TRITON_INTERPRET"].lower() in ("1", "true", "on", "yes")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> torch.device:
    """Where the kernels under test run; skips the combination this session cannot run."""
    pytest.importorskip("triton", reason="triton is not installed (pip install 'pagoda[triton]')")
    if request.param == "cpu" and not INTERPRET:
        pytest.skip("CPU kernel runs need TRITON_INTERPRET=1 (compiled kernels are on)")
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        if INTERPRET:
            pytest.skip("TRITON_INTERPRET=1 interprets kernels; rerun with TRITON_INTERPRET=0")
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
