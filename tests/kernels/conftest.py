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


@pytest.fixture
def row_independent_dot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, ``tl.dot`` with each output computed from its own row alone.

    The interpreter's dot is numpy's ``matmul``, i.e. the host's BLAS, and OpenBLAS's Haswell
    sgemm (``OPENBLAS_CORETYPE=Haswell``, set on the AMD Zen 5 machines) rounds a float32 row
    differently by its position in a micro-tile: a batch-invariance test would then test the
    host's BLAS, not the kernel. A GPU's MMA gives each row the same bits wherever it sits; this
    dot does too (products summed over K per output, whatever the other rows), so the tests
    check what they are about: grid, masks, configs and K order. Compiled kernels are untouched.
    """
    if not INTERPRET:
        return
    from triton.runtime import interpreter

    matmul = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            return matmul(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.dtype
        prod = a.data.astype(acc)[..., :, :, None] * b.data.astype(acc)[..., None, :, :]
        return interpreter.TensorHandle(prod.sum(axis=-2) + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
