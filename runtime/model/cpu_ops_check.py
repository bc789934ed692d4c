"""Load-time integrity check of the native CPU ops: each enabled op against its torch version.

Run once when `cpu_ops` loads the library, on a few random inputs per dtype (T = 3 on the
calling thread and T = 70, which the C code spreads over OpenMP threads). A compiler, a CPU or
a torch build whose rounding the C code does not reproduce shows up here and leaves that op
on torch instead of changing outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pagoda.runtime.model import ops

if TYPE_CHECKING:
    from pagoda.runtime.model.cpu_ops import NativeOps

ROWS = (3, 70)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bits, except that any NaN matches any NaN (ATen's own vectorised
    and scalar paths write different NaN patterns)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    ai, bi = a.contiguous().view(ints), b.contiguous().view(ints)
    return torch.equal(ai[~nan], bi[~nan])


def _check_silu(native: NativeOps, dtype: torch.dtype, g: torch.Generator) -> bool:
    """Width 509 with 71 rows: over ATen's grain size, so its threads split a row mid-way."""
    for t in (3, 71):
        x = (torch.randn(t, 2 * 509, generator=g) * 4).to(dtype)
        if not same_bits(native.silu_and_mul(x=x.clone()), ops.silu_and_mul(x=x.clone())):
            return False
    return True


def _check_rope(native: NativeOps, dtype: torch.dtype, g: torch.Generator) -> bool:
    h, hk, d = 4, 2, 64
    for t in ROWS:
        qkv = torch.randn(t, (h + 2 * hk) * d, generator=g).to(dtype)
        cs = torch.randn(t, d, generator=g).to(dtype)
        results = []
        for fn in (native.rotary_embedding, ops.rotary_embedding):
            y = qkv.clone()
            q, k = y[:, : h * d].view(t, h, d), y[:, h * d : (h + hk) * d].view(t, hk, d)
            fn(positions=None, q=q, k=k, cos_sin_cache=cs)
            results.append(y)
        if not same_bits(*results):
            return False
    return True


def _check_norm(native: NativeOps, dtype: torch.dtype, g: torch.Generator) -> bool:
    """float32 rows show a sum taken in another order in about half of them: rows of 3 and 70
    are enough to catch one."""
    for t in ROWS:
        for n in (64, 200, 576):
            x = (torch.randn(t, n, generator=g) * 3).to(dtype)
            r = torch.randn(t, n, generator=g).to(dtype)
            w = torch.randn(n, generator=g).to(dtype)
            if not same_bits(
                native.rms_norm(x=x, weight=w, eps=1e-5), ops.rms_norm(x=x, weight=w, eps=1e-5)
            ):
                return False
            r1, r2 = r.clone(), r.clone()
            o1, _ = native.rms_norm(x=x, weight=w, eps=1e-6, residual=r1)
            o2, _ = ops.rms_norm(x=x, weight=w, eps=1e-6, residual=r2)
            if not (same_bits(o1, o2) and same_bits(r1, r2)):
                return False
    return True


CHECKS = {"silu_and_mul": _check_silu, "rotary_embedding": _check_rope, "rms_norm": _check_norm}


def self_check(native: NativeOps) -> set[tuple[str, torch.dtype]]:
    """The enabled (op, dtype) pairs whose native result differs from torch's."""
    g = torch.Generator().manual_seed(0)
    failed = {
        (op, dtype)
        for op, dtype in sorted(native.enabled, key=str)
        if not CHECKS[op](native, dtype, g)
    }
    if ("rms_norm", torch.float32) in failed:  # bf16 rounding can hide a wrong sum order
        failed |= {("rms_norm", torch.bfloat16)} & native.enabled
    return failed
