"""Native CPU versions of the Llama layer's elementwise ops, bit-identical to `model/ops.py`'s.

Why: a single-stream decode step on CPU (one row per sequence) spends ~8-10 ms of ~50 ms in
~50 small ATen calls per layer (RMSNorm alone is pow, sum, div_, add_, rsqrt, mul and copies),
each costing 5-15 us of dispatch. Here each op is one call into a small C library
(``csrc/cpu_ops.c``; a CPython extension module, ``csrc/cpu_ops_ext.c``, where Python.h exists,
~0.2 us a call, else ctypes, ~2 us) that keeps every rounding step of the PyTorch version:

- `silu_and_mul`, bf16: silu from a 65,536-entry table made once by torch's own `F.silu` over
  every bf16 bit pattern (exact whatever exp torch uses); the product rounded as torch's bf16
  mul rounds it. float32: ATen's x / (1 + exp(-x)) with its two exps, Sleef's expf (reproduced
  in C) where its vector loop runs and libm's expf in the scalar tail of each segment its
  threads take (so the result depends on torch's thread count, as torch's does). The float32
  vector step (`SILU_BLOCK`) is known for the AVX512 and AVX2 capabilities; others keep torch.
- `rotary_embedding` (bf16, float32): each product, sum and difference rounded to the dtype.
- `rms_norm` (bf16, float32): the float32 sum of squares follows ATen's cascade summation for
  the float lane count of ATen's sum kernel (8 under the AVX512 and AVX2 capabilities, since
  the AVX512 build of that kernel is not registered); other capabilities keep torch.

Each native op is checked against torch once when the library loads (`self_check`: a few random
inputs per dtype, T = 3 on the calling thread and T = 70, which the C code spreads over OpenMP
threads); a compiler, a CPU or a torch build whose rounding the C code does not reproduce logs a
warning and leaves that op (for that dtype) on torch. `PAGODA_CPU_OPS=torch` turns all of them
off. Inputs the C code does not cover (other dtypes, odd strides) go to the torch versions, which
the caller hands in (`cpu_ops(torch_ops)`): this package does not import the model's.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.machinery
import importlib.util
import logging
import os
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pagoda.runtime.cpu import build as builder

if TYPE_CHECKING:
    from pagoda.runtime.model.ops import Ops

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
FLAGS += ["-fno-trapping-math", "-shared", "-fPIC"]  # no value changes: see csrc/cpu_ops.c
ENV_SWITCH = "PAGODA_CPU_OPS"  # "native" (default) or "torch"
# Float lanes of ATen's sum kernel per capability: SumKernel.cpp registers with REGISTER_DISPATCH,
# which leaves the AVX512 slot empty, so AVX512 runs the AVX2 kernel (8 lanes).
LANES = {"AVX512": 8, "AVX2": 8}
# Elements per step of ATen's float32 silu vector loop (2 Vectorized<float>) per capability.
SILU_BLOCK = {"AVX512": 32, "AVX2": 16}
GRAIN_SIZE = 32768  # at::internal::GRAIN_SIZE: smaller elementwise ops run on one thread
MAX_NORM_WIDTH = GRAIN_SIZE  # from here up, ATen splits a one-row sum across threads
NATIVE_DTYPES = (torch.bfloat16, torch.float32)
PARALLEL_ROWS = 64  # more rows than this: spread over torch's thread count
CSRC = Path(__file__).parent / "csrc"
ROWS = (3, 70)  # the self-check's row counts: on the calling thread, and over OpenMP threads


def build(cache_dir: Path | None = None, extension: bool = False) -> Path:
    """Compile the library (`extension`: as a CPython extension module) into the cache, once
    per source, compiler, flags and CPU."""
    cc = builder.find_compiler("CC", ["cc", "gcc", "clang"])
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    if not extension:
        return builder.build(
            CSRC / "cpu_ops.c", name="cpu_ops", compiler=cc, flags=FLAGS, directory=cache_dir
        )
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {include}")
    flags = [*FLAGS, f"-I{include}"]
    return builder.build(
        CSRC / "cpu_ops_ext.c", name="cpu_ops_ext", compiler=cc, flags=flags, directory=cache_dir
    )


def silu_table() -> torch.Tensor:
    """torch's bf16 `F.silu` of every bf16 bit pattern, indexed by the pattern, as float32."""
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return F.silu(bits).float().contiguous()


def load_library(extension: bool = True) -> Any:
    """The C entry points, all called with integers (pointers, 0 for NULL) and floats: from
    the extension module when it builds (fast calls), else through ctypes."""
    try:
        if not extension:
            raise RuntimeError("ctypes asked for")
        path = build(extension=True)
        loader = importlib.machinery.ExtensionFileLoader("pagoda_cpu_ops", str(path))
        spec = importlib.util.spec_from_loader("pagoda_cpu_ops", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except (OSError, RuntimeError, ImportError) as exc:
        log.info("CPU ops extension module unavailable, calling through ctypes: %s", exc)
    lib = ctypes.CDLL(str(build()))
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    lib.pagoda_silu_mul_bf16.argtypes = [p, p, p, i64, i64, i64, i64, i32]
    lib.pagoda_silu_mul_f32.argtypes = [p, p, i64, i64, i64, i64, i64, i64, i32]
    lib.pagoda_rope.argtypes = [p, p, i32, i64, i64, i64, i64, i64, i64, i32]
    lib.pagoda_rms_norm.argtypes = [p, p, p, p, i32, i64, i64, i64, f32, i32, i32]
    for fn in (
        lib.pagoda_silu_mul_bf16,
        lib.pagoda_silu_mul_f32,
        lib.pagoda_rope,
        lib.pagoda_rms_norm,
    ):
        fn.restype = None
    return lib


def _aten_chunk(numel: int) -> int:
    """The elements each thread takes in ATen's `parallel_for` over `numel` (OpenMP build)."""
    threads = torch.get_num_threads()
    if numel < GRAIN_SIZE or threads == 1:
        return max(numel, 1)
    threads = min(threads, -(-numel // GRAIN_SIZE))
    return -(-numel // threads)


def _threads(t: int) -> int:
    """OpenMP threads for t rows: waking a pool thread costs ~50 us, more than small ops."""
    return torch.get_num_threads() if t > PARALLEL_ROWS else 1


class NativeOps:
    """The three ops with `model/ops.py`'s keyword signatures; `enabled` holds (op, dtype) pairs
    that run natively (the rest, and inputs the C code does not cover, call `torch_ops`, the
    PyTorch versions). The checks are kept few and cheap: at T=1 they cost as much as the op
    itself."""

    def __init__(
        self, lib: Any, torch_ops: Ops, lanes: int | None, silu_block: int | None = None
    ) -> None:
        self.lib, self.torch, self.lanes, self.silu_block = lib, torch_ops, lanes, silu_block
        self.table = silu_table()
        self.table_ptr = self.table.data_ptr()
        self.enabled = {("silu_and_mul", torch.bfloat16)}
        if silu_block is not None:
            self.enabled.add(("silu_and_mul", torch.float32))
        self.enabled |= {("rotary_embedding", dt) for dt in NATIVE_DTYPES}
        if lanes is not None:
            self.enabled |= {("rms_norm", dt) for dt in NATIVE_DTYPES}

    def silu_and_mul(self, *, x: torch.Tensor) -> torch.Tensor:
        """`model.ops.silu_and_mul`: [T, 2I] → silu(gate) * up; the gate half is overwritten too."""
        if (
            ("silu_and_mul", x.dtype) not in self.enabled
            or x.ndim != 2
            or x.shape[1] % 2
            or not x.is_cpu
        ):
            return self.torch.silu_and_mul(x=x)
        (t, n), (rs, cs) = x.shape, x.stride()
        if cs != 1:
            return self.torch.silu_and_mul(x=x)
        n >>= 1
        out = torch.empty(t, n, dtype=x.dtype)
        if x.dtype == torch.bfloat16:
            self.lib.pagoda_silu_mul_bf16(
                x.data_ptr(), out.data_ptr(), self.table_ptr, t, n, rs, n, _threads(t)
            )
        else:
            chunk, block = _aten_chunk(t * n), self.silu_block
            self.lib.pagoda_silu_mul_f32(
                x.data_ptr(), out.data_ptr(), t, n, rs, n, chunk, block, _threads(t)
            )
        return out

    def rotary_embedding(
        self,
        *,
        positions: torch.Tensor | None,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`model.ops.rotary_embedding`, in place: q [T, H, D] and k [T, Hkv, D] (one call when k's
        heads follow q's in memory, as in the fused qkv output)."""
        cs = cos_sin_cache
        if positions is not None:  # `model.ops.gather_cos_sin`
            cs = cos_sin_cache.index_select(0, positions).to(q.dtype)
        if not self._rope_ok(q, k, cs):
            return self.torch.rotary_embedding(positions=None, q=q, k=k, cos_sin_cache=cs)
        t, h, d = q.shape
        bf, nt, cp, qs, ks = (
            q.dtype == torch.bfloat16,
            _threads(t),
            cs.data_ptr(),
            q.stride(),
            k.stride(),
        )
        qp, kp, hk = q.data_ptr(), k.data_ptr(), k.shape[1]
        rope = self.lib.pagoda_rope
        if (
            kp == qp + h * qs[1] * q.element_size()
            and qs[1] == ks[1]
            and (t == 1 or qs[0] == ks[0])
        ):
            rope(qp, cp, bf, t, h + hk, d, qs[0], qs[1], cs.stride(0), nt)  # one joint tensor
        else:
            rope(qp, cp, bf, t, h, d, qs[0], qs[1], cs.stride(0), nt)
            rope(kp, cp, bf, t, hk, d, ks[0], ks[1], cs.stride(0), nt)
        return q, k

    def _rope_ok(self, q: torch.Tensor, k: torch.Tensor, cs: torch.Tensor) -> bool:
        if ("rotary_embedding", q.dtype) not in self.enabled or not q.is_cpu:
            return False
        if k.dtype != q.dtype or cs.dtype != q.dtype or q.ndim != 3 or k.ndim != 3:
            return False
        t, _, d = q.shape
        if d % 2 or k.shape[0] != t or k.shape[2] != d or cs.shape != (t, d):
            return False
        (_, qh, qe), (_, kh, ke) = q.stride(), k.stride()
        return qe == 1 and ke == 1 and qh >= d and kh >= d and cs.stride(1) == 1  # no overlap

    def rms_norm(
        self,
        *,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ):
        """`model.ops.rms_norm`: HF's RMSNorm of x, or with a residual of x + residual (added in
        place), then returning (norm, residual)."""
        if not self._norm_ok(x, weight, residual):
            return self.torch.rms_norm(x=x, weight=weight, eps=eps, residual=residual)
        (t, n), rs = x.shape, x.stride(0)
        out = torch.empty_like(x) if rs == n else torch.empty(t, n, dtype=x.dtype)
        self.lib.pagoda_rms_norm(
            x.data_ptr(), 0 if residual is None else residual.data_ptr(), weight.data_ptr(),
            out.data_ptr(), x.dtype == torch.bfloat16, t, n, rs, eps, self.lanes, _threads(t),
        )  # fmt: skip
        return out if residual is None else (out, residual)

    def _norm_ok(self, x: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None) -> bool:
        if ("rms_norm", x.dtype) not in self.enabled or x.ndim != 2 or not x.is_cpu:
            return False
        n = x.shape[1]
        if not (self.lanes <= n < MAX_NORM_WIDTH) or x.stride()[1] != 1:
            return False
        if w.dtype != x.dtype or w.shape != (n,) or w.stride() != (1,):
            return False
        return res is None or (
            res.dtype == x.dtype
            and res.shape == x.shape
            and res.is_contiguous()
            and res.data_ptr() != x.data_ptr()
        )

    def as_ops(self) -> Ops:
        return dataclasses.replace(
            self.torch,
            rms_norm=self.rms_norm,
            rotary_embedding=self.rotary_embedding,
            silu_and_mul=self.silu_and_mul,
            pregather_rotary=True,
        )


def cpu_ops(torch_ops: Ops) -> Ops | None:
    """The native ops (self-checked against `torch_ops`, the PyTorch versions, which also take
    what the C code does not cover), or None when `PAGODA_CPU_OPS=torch` or the library cannot
    be built: the caller then keeps `torch_ops`."""
    choice = os.environ.get(ENV_SWITCH, "native")
    if choice not in ("native", "torch"):
        raise ValueError(f"{ENV_SWITCH} must be native or torch, got {choice!r}")
    if choice == "torch":
        return None
    native_ops = _native_ops(torch_ops)
    return None if native_ops is None else native_ops.as_ops()


@functools.cache
def _native_ops(torch_ops: Ops) -> NativeOps | None:
    try:
        lib = load_library()
    except (OSError, RuntimeError) as exc:
        log.warning("native CPU ops unavailable, using the torch ops: %s", exc)
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    result = NativeOps(lib, torch_ops, LANES.get(capability), SILU_BLOCK.get(capability))
    for op, dtype in sorted(self_check(result), key=str):
        log.warning("native CPU %s (%s) differs from torch; using torch for it", op, dtype)
        result.enabled.discard((op, dtype))
    return result


# --- the load-time self-check ---------------------------------------------------------------------


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
        if not same_bits(native.silu_and_mul(x=x.clone()), native.torch.silu_and_mul(x=x.clone())):
            return False
    return True


def _check_rope(native: NativeOps, dtype: torch.dtype, g: torch.Generator) -> bool:
    h, hk, d = 4, 2, 64
    for t in ROWS:
        qkv = torch.randn(t, (h + 2 * hk) * d, generator=g).to(dtype)
        cs = torch.randn(t, d, generator=g).to(dtype)
        results = []
        for fn in (native.rotary_embedding, native.torch.rotary_embedding):
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
                native.rms_norm(x=x, weight=w, eps=1e-5),
                native.torch.rms_norm(x=x, weight=w, eps=1e-5),
            ):
                return False
            r1, r2 = r.clone(), r.clone()
            o1, _ = native.rms_norm(x=x, weight=w, eps=1e-6, residual=r1)
            o2, _ = native.torch.rms_norm(x=x, weight=w, eps=1e-6, residual=r2)
            if not (same_bits(o1, o2) and same_bits(r1, r2)):
                return False
    return True


CHECKS = {"silu_and_mul": _check_silu, "rotary_embedding": _check_rope, "rms_norm": _check_norm}


def self_check(native: NativeOps) -> set[tuple[str, torch.dtype]]:
    """The enabled (op, dtype) pairs whose native result differs from torch's (`native.torch`)."""
    g = torch.Generator().manual_seed(0)
    failed = {
        (op, dtype)
        for op, dtype in sorted(native.enabled, key=str)
        if not CHECKS[op](native, dtype, g)
    }
    if ("rms_norm", torch.float32) in failed:  # bf16 rounding can hide a wrong sum order
        failed |= {("rms_norm", torch.bfloat16)} & native.enabled
    return failed
