"""float32 matmuls that read GGUF-quantized (Q4_0/1, Q5_0/1, Q8_0, IQ4_NL, Q3/4/5/6_K, IQ4_XS) and
16-bit weights in place.

On CPUs without native bf16 (AVX2 only: AMD Zen 1-3, older Xeons) the model computes in float32
and a decode step streams every weight from memory: 540 MB for the embedded 135M model, where
its Q4_1/Q8_0 blocks are 96 MB. This kernel keeps the blocks (re-laid out once: 16 outputs by 32
keys per unit; 4-bit integers two a byte, wider ones and table values a byte each) and dequantizes a chunk of keys of one block of 16
outputs into an L1 buffer, exactly as `gguf.quants` does (`quantized`), then sweeps every row
tile of the task over it with FMAs. A weight is thus the same float32 value as in the
dequantized model; each output is one accumulator updated key by key in order, carried between
chunks in float32, so a row's bits depend neither on M, nor on its tile, nor on the threads (the
batch-invariance guarantee of docs/runtime.md holds). AVX2 + FMA + F16C; ``PAGODA_CPU_QGEMM=0``
turns it off (oneDNN's float32 GEMM over the dequantized weights then runs).
An LM head bound here can also hand back tokens instead of logits (`QGemmWeight.sample`, the
sampling mode of ``csrc/qgemm_sample.h``), and an embedding table its rows (`QGemmWeight.rows`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence

import torch
from pagoda.runtime.cpu import build, calls, gemv
from pagoda.runtime.cpu.quantized import HALF_KINDS, QK, QuantizedWeight, probe_weight

log = logging.getLogger(__name__)

ENV_SWITCH = "PAGODA_CPU_QGEMM"
NB = 16  # outputs per unit
# each stored kind -> the kernel's unit layout (C enum) that holds it exactly: Q5_0 and IQ4_NL
# as Q8_0 (int8 integers, a float16 scale), Q3_K and IQ4_XS as Q6_K (int8 integers, a float32
# scale per 16 keys), Q5_1 as int8 integers with Q4_1's scale and offset
KINDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 2, "IQ4_NL": 2, "Q4_K": 3, "Q6_K": 4,
         "Q3_K": 4, "IQ4_XS": 4, "Q5_K": 5, "F16": 6, "BF16": 7, "Q5_1": 8}  # fmt: skip
BYTES8 = {2, 4, 5, 8}  # unit layouts with an int8 per weight (the others: two per byte)
SERIAL_BELOW = 1 << 18  # multiply-adds below which the calling thread works alone


def pack(weight: QuantizedWeight) -> torch.Tensor:
    """The kernel's layout, uint8: per block of 16 outputs (rows padded with zero weights), per
    32 keys, the integers [key][output] (Q4: output j and j + 8 share byte j) then d[16] and, for
    Q4_1, m[16] as float16 (as GGUF stores them; converted exactly in the kernel); F16/BF16:
    the 16-bit values [key][output]."""
    n, k = weight.rows, weight.cols
    pad = -n % NB
    if weight.kind in HALF_KINDS:
        v = weight.blocks.view(torch.int16)
        v = _pad_rows(v, pad) if pad else v
        v = v.view((n + pad) // NB, NB, k // QK, QK).permute(0, 2, 3, 1).contiguous()
        return v.view(torch.uint8).reshape(-1)
    q, d, m = weight.fields(raw_scales=True)
    if pad:  # zero rows: zero weights, outputs never stored
        q, d = _pad_rows(q, pad), _pad_rows(d, pad)
        m = None if m is None else _pad_rows(m, pad)
    nblk, kb = (n + pad) // NB, k // QK
    q = q.view(nblk, NB, kb, QK).permute(0, 2, 3, 1)  # [block, key block, key, output]
    if KINDS[weight.kind] in BYTES8:
        ints = q.to(torch.int8).contiguous().view(torch.uint8).reshape(nblk, kb, QK * NB)
    else:
        if weight.kind == "Q4_0":
            q = q + 8  # back to the stored nibble; the kernel subtracts 8
        q = q.to(torch.uint8)
        ints = (q[..., : NB // 2] | (q[..., NB // 2 :] << 4)).reshape(nblk, kb, QK * NB // 2)
    scales = [s.view(nblk, NB, kb).transpose(1, 2).contiguous() for s in (d, m) if s is not None]
    width = NB * scales[0].element_size()
    parts = [ints] + [s.view(torch.uint8).reshape(nblk, kb, width) for s in scales]
    return torch.cat(parts, dim=-1).reshape(-1).contiguous()


def _pad_rows(t: torch.Tensor, pad: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(pad, t.shape[1])])


class QGemm:
    """The compiled kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pagoda_qgemm.argtypes = [i32, p, p, i64, p, i64, p, i32, i32, i32, i32]
        lib.pagoda_qgemm_sample.argtypes = [i32, p, p, i64, p, i32, i32, i32, p, p, i32, p]
        lib.pagoda_sample_logits.argtypes = [p, i64, p, i32, i32, p, p, i32, p]
        lib.pagoda_qgemm_rows.argtypes = [i32, p, i32, i32, p, i64, p]
        fns = (lib.pagoda_qgemm, lib.pagoda_qgemm_sample, lib.pagoda_sample_logits)
        for fn in (*fns, lib.pagoda_qgemm_rows):
            fn.restype = i32
        self.fn, self.sample_fn, self.logits_fn = fns
        self.rows_fn = lib.pagoda_qgemm_rows

    def bind(
        self, weight: QuantizedWeight | Sequence[QuantizedWeight], bias: torch.Tensor | None
    ) -> QGemmWeight:
        parts = [weight] if isinstance(weight, QuantizedWeight) else list(weight)
        return QGemmWeight(self, parts, bias)

    def sample_logits(
        self,
        logits: torch.Tensor,
        scale: torch.Tensor | None,
        u: torch.Tensor | None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token per row of float32 `logits` [M, N], picked as `QGemmWeight.sample` picks
        it from outputs it never stores (the same code, so the same token); with `rows`
        (int64), for those rows only, read in place (scale and u then per chosen row)."""
        if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
            raise ValueError(f"expected float32 [M, N] rows, got {logits.dtype} {logits.shape}")
        m, n = calls.row_count(rows, logits.shape[0]), logits.shape[1]
        out = torch.zeros(m, dtype=torch.long)
        if m == 0:
            return out
        threads = torch.get_num_threads() if m * n >= SERIAL_BELOW else 1
        idx = None if rows is None else rows.data_ptr()
        args = (logits.data_ptr(), logits.stride(0), idx, m, n, *_row_args(m, scale, u))
        rc = self.logits_fn(*args, threads, out.data_ptr())
        if rc:
            raise RuntimeError(f"sampling from logits failed (code {rc}) for {m}x{n}")
        return out


def _row_args(m: int, scale: torch.Tensor | None, u: torch.Tensor | None) -> tuple:
    """Pointers to the per-row scales (log2(e) / temperature, 0 on greedy rows) and uniforms,
    float32 [m] (both None: every row greedy), kept alive by the caller's tensors."""
    if scale is None:
        return None, None
    for t in (scale, u):
        if t is None or t.dtype != torch.float32 or t.shape != (m,) or not t.is_contiguous():
            raise ValueError(f"scale and u must be contiguous float32 [{m}]")
    return scale.data_ptr(), u.data_ptr()


class QGemmWeight:
    """Row blocks of one weight (q/k/v may be stored in different kinds), packed and bound to
    the kernel: x float32 [M, K] -> [M, N], each part writing its columns of y in place."""

    __slots__ = ("bias", "fn", "k", "kinds", "n", "nbytes", "parts", "rows_fn", "sample_fn")

    def __init__(
        self, kernel: QGemm, parts: list[QuantizedWeight], bias: torch.Tensor | None
    ) -> None:
        if not parts or any(p.cols != parts[0].cols for p in parts):
            raise ValueError("quantized parts must share their number of columns")
        self.fn, self.k, self.n = kernel.fn, parts[0].cols, sum(p.rows for p in parts)
        self.sample_fn, self.rows_fn = kernel.sample_fn, kernel.rows_fn
        self.kinds = tuple(p.kind for p in parts)
        self.bias = None if bias is None else bias.to(torch.float32).contiguous()
        self.parts: list[tuple[int, torch.Tensor, int, int]] = []  # kind, packed, row0, rows
        row0 = 0
        for p in parts:
            self.parts.append((KINDS[p.kind], pack(p), row0, p.rows))
            row0 += p.rows
        self.nbytes = sum(packed.numel() for _, packed, _, _ in self.parts)

    def _checked(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """x with unit stride in K, and the threads its size deserves."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"expected float32 [M, {self.k}], got {x.dtype} {tuple(x.shape)}")
        if x.stride(1) != 1:
            x = x.contiguous()
        big = self.n * self.k * x.shape[0] >= SERIAL_BELOW
        return x, torch.get_num_threads() if big else 1

    def _one_part(self, what: str) -> tuple[int, torch.Tensor, int]:
        """The kind, units and rows of a weight of one part (an LM head, an embedding)."""
        if len(self.parts) != 1:
            raise ValueError(f"{what}: only for a weight of one part")
        kind, packed, _, rows = self.parts[0]
        return kind, packed, rows

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """`self(x).argmax(-1)` as `argmax_rows` computes it (first maximum; -1 for a row with
        no finite maximum: a NaN or +inf output, or all -inf), without storing the [M, N]
        outputs; for a weight of one part."""
        return self.sample(x, None, None)

    def sample(
        self, x: torch.Tensor, scale: torch.Tensor | None, u: torch.Tensor | None
    ) -> torch.Tensor:
        """One token per row of `self(x)`, the token `QGemm.sample_logits` picks from those
        outputs with the rows' scales (log2(e) / temperature; 0: greedy) and uniforms, without
        storing them; for a weight of one part (an LM head)."""
        kind, packed, rows = self._one_part("sampling")
        out = torch.zeros(x.shape[0], dtype=torch.long)
        if x.shape[0] == 0:
            return out
        x, threads = self._checked(x)
        bias = None if self.bias is None else self.bias.data_ptr()
        args = (kind, packed.data_ptr(), x.data_ptr(), x.stride(0), bias, x.shape[0], rows)
        rc = self.sample_fn(
            *args, self.k, *_row_args(x.shape[0], scale, u), threads, out.data_ptr()
        )
        if rc:
            raise RuntimeError(f"quantized GEMM sampling failed (code {rc}) for {tuple(x.shape)}")
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), K]: the weight's rows `ids` (`F.embedding` over the dequantized
        weight, without keeping that float32 table); for a weight of one part."""
        kind, packed, rows = self._one_part("row lookups")
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.numel(), self.k, dtype=torch.float32)
        rc = self.rows_fn(
            kind, packed.data_ptr(), rows, self.k, ids.data_ptr(), ids.numel(), out.data_ptr()
        )
        if rc == 4:
            raise IndexError(f"token id out of range for an embedding of {rows} rows")
        if rc:
            raise RuntimeError(f"quantized row lookup failed (code {rc})")
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        y = torch.empty(m, self.n, dtype=torch.float32)
        if m == 0:
            return y
        x, threads = self._checked(x)
        xp, ldx, yp = x.data_ptr(), x.stride(0), y.data_ptr()
        for kind, packed, row0, rows in self.parts:
            bias = None if self.bias is None else self.bias.data_ptr() + 4 * row0
            args = (kind, packed.data_ptr(), xp, ldx, yp + 4 * row0, self.n, bias, m, rows)
            rc = self.fn(*args, self.k, threads)
            if rc:
                raise RuntimeError(f"quantized GEMM failed (code {rc}) for {m}x{self.k} @ {rows}")
        return y


def wanted() -> bool:
    """``PAGODA_CPU_QGEMM``: on unless ``0`` (``1`` and ``auto``, the default, mean on)."""
    choice = os.environ.get(ENV_SWITCH, "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"{ENV_SWITCH} must be auto, 0 or 1, got {choice!r}")
    return choice != "0"


@functools.cache
def load() -> QGemm | None:
    """The kernel, or None (no compiler, no AVX2 + FMA, or it fails its load-time check)."""
    compiler = build.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        path = gemv.compile_kernel("qgemm", compiler)  # gemv's flags and shared headers
        kernel = QGemm(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError) as exc:
        log.warning("quantized CPU GEMM unavailable, float32 weights are used: %s", exc)
        return None
    return kernel if _agrees(kernel) else None


def _agrees(kernel: QGemm) -> bool:
    """The kernel against float64 on probes of every kind, padded in N, through both paths
    (1 and 3 rows in registers, 7 through the buffer); a load-time check."""
    g = torch.Generator().manual_seed(1)
    for kind in KINDS:
        w = probe_weight(kind, 40, 256)
        x = torch.randn(7, 256, generator=g)
        bias = torch.randn(40, generator=g)
        bound = kernel.bind(w, bias)
        dense = w.dequantize().double()
        want = x.double() @ dense.T + bias.double()
        # float32 sums of 256 terms: off by at most ~256 * 2^-24 of the terms' absolute sum
        tol = 3e-5 * (x.double().abs() @ dense.abs().T + bias.double().abs()) + 1e-6
        try:
            got = [bound(x[:rows]).double() for rows in (1, 3, 7)]
        except RuntimeError as exc:
            log.warning("quantized CPU GEMM off: %s", exc)
            return False
        if not all(((y - want[: len(y)]).abs() <= tol[: len(y)]).all() for y in got):
            log.warning("quantized CPU GEMM off: it disagrees with float64 on a %s probe", kind)
            return False
    return True
