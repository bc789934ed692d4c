"""Linear layers with weights laid out once for the CPU's matrix units, batch-invariant.

`F.linear` on CPU hands oneDNN a plain row-major weight, which it re-lays out (for AMX tiles)
on every call. Packing each weight once at load time with oneDNN's own reorder makes bf16 prefill
GEMMs ~2.5x and decode GEMMs ~1.8x faster, with bit-identical results.

Packing also serves greedy determinism (docs/runtime.md, "What is guaranteed"): oneDNN's packed
GEMM gives every row the same bits whatever the number of rows M, for M >= 2, in bf16 and
float32, while MKL's float32 `F.linear` changes its blocking (and rounding) with M. A single row
takes a GEMV path with another summation order, so a lone row is computed as two.
On CPUs with AMX, oneDNN's bf16 GEMM is not M-invariant; there `amx_gemm` (AMX tiles over the
same packed weights, one summation order for every M, faster than oneDNN at every M measured)
takes every bf16 call. Without AMX every bf16 call goes to `gemv` (M-invariant too, faster at
decode sizes); on AMX CPUs without the AMX GEMM, only steps of up to 4 rows (see there).
float32 weights that came from GGUF Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K blocks or from float16/bfloat16
matrices (CPUs without native bf16 compute in float32) are multiplied by those stored weights
themselves (`qgemm`, M-invariant, every call).
Weights on CUDA stay plain; with ``invariant`` they go through ``pagoda.kernels.linear``, whose
reduction order depends on the weight's shape alone (cuBLAS chooses its kernel by M).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from pagoda.runtime.cpu import amx_gemm, gemv, qgemm
from pagoda.runtime.cpu.quantized import QuantizedWeight
from pagoda.runtime.sampling.ops import argmax_rows

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

    __slots__ = ("bias", "fast", "fast_rows", "kernel", "packed", "weight")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        invariant: bool = False,
        quantized: QuantizedWeight | Sequence[QuantizedWeight] | None = None,
    ) -> None:
        self.bias = bias
        self.packed = None
        self.kernel = None
        # see the docstring: bf16 kernels, or float32 over the GGUF blocks `quantized`
        self.fast: amx_gemm.AmxWeight | gemv.GemvWeight | qgemm.QGemmWeight | None = None
        self.fast_rows = 0  # the most rows `fast` takes
        self.weight: torch.Tensor | None = weight
        cpu = weight.device.type == "cpu"
        f32 = cpu and weight.dtype == torch.float32
        if f32 and quantized is not None and self._bind_quantized(quantized):
            return
        if invariant and weight.device.type == "cuda":
            from pagoda.kernels import linear  # needs Triton, which CUDA installs have

            self.kernel = linear
            self.weight = weight.contiguous()
        if cpu and weight.dtype in PACKED_DTYPES and _can_pack(weight.dtype):
            self.packed = _pack(weight)
            self.weight = None  # the packed copy replaces it
            if weight.dtype == torch.bfloat16:
                self._pick_fast_path()

    def _bind_quantized(self, quantized: QuantizedWeight | Sequence[QuantizedWeight]) -> bool:
        """Whether `qgemm` takes every call (then the float32 weight is dropped)."""
        kernel = qgemm.load() if qgemm.wanted() else None
        parts = [quantized] if isinstance(quantized, QuantizedWeight) else list(quantized)
        shape = (sum(p.rows for p in parts), parts[0].cols if parts else 0)
        if kernel is None or not parts or shape != tuple(self.weight.shape):
            return False
        self.fast, self.fast_rows = kernel.bind(quantized, self.bias), 1 << 62
        self.weight = None
        return True

    def _pick_fast_path(self) -> None:
        n, k = self.packed.shape
        amx = amx_gemm.load(_pack)
        if amx is not None and amx.accepts(self.packed, n, k):
            self.fast, self.fast_rows = amx.bind(self.packed, self.bias), 1 << 62
            return
        small = gemv.load(_pack) if gemv.wanted() else None
        if small is not None and small.accepts(self.packed, n, k):
            self.fast, self.fast_rows = small.bind(self.packed, self.bias), gemv.max_rows()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x=x, weight=self.weight, bias=self.bias)
        if self.fast is not None and (0 < x.shape[0] <= self.fast_rows or self.packed is None):
            return self.fast(x)
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        if x.shape[0] == 1:  # keep the GEMM path (and its rounding) for a lone row
            return self._packed(x.expand(2, -1))[:1]
        return self._packed(x)

    @property
    def fuses_sampling(self) -> bool:
        """Whether `argmax` and `sample` can skip the outputs (`qgemm`, one part)."""
        return isinstance(self.fast, qgemm.QGemmWeight) and len(self.fast.parts) == 1

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """`self(x).argmax(-1)` (first maximum; NaN never wins), fused where `fuses_sampling`:
        a greedy step's LM head then never writes its [M, vocab] logits."""
        if self.fuses_sampling:
            return self.fast.argmax(x)
        return argmax_rows(self(x))

    def sample(self, x: torch.Tensor, scale: torch.Tensor | None, u: torch.Tensor | None):
        """One token per row of `self(x)` without writing the outputs (`QGemmWeight.sample`:
        scale = log2(e) / temperature, 0 on greedy rows, u the rows' uniforms); only where
        `fuses_sampling`."""
        if not self.fuses_sampling:
            raise ValueError("this layer's kernel does not sample from its outputs")
        return self.fast.sample(x, scale, u)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def bf16_rows_invariant() -> bool:
    """Whether a bf16 row gets the same bits for every row count here (docs/runtime.md): yes
    with oneDNN except on AMX, where yes when the AMX GEMM runs, and not with the GEMV."""
    return not gemv.onednn_uses_amx() or amx_gemm.load(_pack) is not None
