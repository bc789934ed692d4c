"""Linear layers with weights laid out once for the CPU's matrix units, batch-invariant.

`F.linear` on CPU hands oneDNN a plain row-major weight, which it re-lays out (for AMX tiles)
on every call. Packing each weight once at load time with oneDNN's own reorder makes bf16 prefill
GEMMs ~2.5x and decode GEMMs ~1.8x faster, with bit-identical results.

Packing also serves greedy determinism (docs/runtime.md, "What is guaranteed"): oneDNN's packed
GEMM gives every row the same bits whatever the number of rows M, for M >= 2, in bf16 and
float32, while MKL's float32 `F.linear` changes its blocking (and rounding) with M. A single row
takes a GEMV path with another summation order, so a lone row is computed as two.
Weights on CUDA stay plain; with ``invariant`` they go through ``pagoda.kernels.linear``, whose
reduction order depends on the weight's shape alone (cuBLAS chooses its kernel by M).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from pagoda.runtime.model import gemv

PACK_BATCH_HINT = 2048  # oneDNN picks the blocked layout for this M; it serves small M well too
PACKED_DTYPES = (torch.bfloat16, torch.float32)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)


@functools.cache
def _can_pack(dtype: torch.dtype) -> bool:
    try:
        w = torch.zeros(32, 32, dtype=dtype)
        packed = _pack(w)
        torch.ops.mkldnn._linear_pointwise(
            torch.zeros(2, 32, dtype=dtype), packed, None, "none", [], ""
        )
        return True
    except (AttributeError, RuntimeError):
        return False


class Linear:
    """y = x @ weight.T + bias for 2-D x."""

    __slots__ = ("bias", "gemv", "kernel", "packed", "weight")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, invariant: bool = False
    ) -> None:
        self.bias = bias
        self.packed = None
        self.kernel = None
        self.gemv: gemv.GemvWeight | None = None  # decode-sized bf16 batches on AMX CPUs
        self.weight: torch.Tensor | None = weight
        cpu = weight.device.type == "cpu"
        if invariant and weight.device.type == "cuda":
            from pagoda.kernels import linear  # needs Triton, which CUDA installs have

            self.kernel = linear
            self.weight = weight.contiguous()
        if cpu and weight.dtype in PACKED_DTYPES and _can_pack(weight.dtype):
            self.packed = _pack(weight)
            self.weight = None  # the packed copy replaces it
            if weight.dtype == torch.bfloat16 and gemv.wanted(invariant):
                fast = gemv.load(_pack)
                if fast is not None and fast.accepts(self.packed, *weight.shape):
                    self.gemv = fast.bind(self.packed, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x=x, weight=self.weight, bias=self.bias)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if self.gemv is not None and 0 < x.shape[0] <= gemv.MAX_ROWS:
            return self.gemv(x)
        if x.shape[0] == 1:  # keep the GEMM path (and its rounding) for a lone row
            return self._packed(x.expand(2, -1))[:1]
        return self._packed(x)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
