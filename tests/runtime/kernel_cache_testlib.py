"""Real Triton cache entries for tests, compiled on this CPU-only machine: Triton's wheel brings
ptxas, so `triton.compile` with an explicit target makes the sm_90 cubins an H100/H200 runs."""

from __future__ import annotations

import time

import triton
import triton.language as tl
from pagoda.runtime.kernel_cache import Identity, pagoda_version
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)
IDENTITY = Identity(triton.__version__, "cuda:90", pagoda_version())  # this process on an H200


def _scale(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


# JITFunction directly: under TRITON_INTERPRET=1 `@triton.jit` gives an interpreted function
SCALE = JITFunction(_scale)
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "factor": "fp32", "BLOCK": "constexpr"}


def compile_scale(block: int) -> tuple[object, float]:
    """One kernel variant per ``block`` into $TRITON_CACHE_DIR; (the kernel, seconds taken)."""
    start = time.perf_counter()
    src = ASTSource(SCALE, SIGNATURE, constexprs={"BLOCK": block})
    kernel = triton.compile(src, target=TARGET)
    return kernel, time.perf_counter() - start


def cache_files(cache_dir) -> dict[str, int]:
    """{relative path: size} of every file under a Triton cache directory."""
    return {str(p.relative_to(cache_dir)): p.stat().st_size
            for p in sorted(cache_dir.rglob("*")) if p.is_file()}  # fmt: skip
