"""Real Triton cache entries for tests, compiled on this CPU-only machine: Triton's wheel brings
ptxas, so `triton.compile` with an explicit target makes the sm_90 cubins an H100/H200 runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

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


def compile_scale(block: int) -> tuple[SimpleNamespace, float]:
    """One kernel variant per ``block`` into $TRITON_CACHE_DIR; (the kernel's ``hash`` and
    ``asm["cubin"]``, seconds the compile took). Compiled in a fresh process: once a test has run
    a kernel under TRITON_INTERPRET=1, the interpreter's patches of `triton.language` break a
    real compile in that process ('value' object has no attribute 'dtype')."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "import kernel_cache_testlib as t; print(json.dumps(t._compile_here(int(sys.argv[2]))))"
    )
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-P", "-c", code, here, str(block)], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"compiling the test kernel failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    kernel = SimpleNamespace(hash=got["hash"], asm={"cubin": bytes.fromhex(got["cubin"])})
    return kernel, got["seconds"]


def _compile_here(block: int) -> dict:
    start = time.perf_counter()
    src = ASTSource(SCALE, SIGNATURE, constexprs={"BLOCK": block})
    kernel = triton.compile(src, target=TARGET)
    seconds = time.perf_counter() - start
    return {"hash": kernel.hash, "cubin": kernel.asm["cubin"].hex(), "seconds": seconds}


def cache_files(cache_dir) -> dict[str, int]:
    """{relative path: size} of every file under a Triton cache directory."""
    return {str(p.relative_to(cache_dir)): p.stat().st_size
            for p in sorted(cache_dir.rglob("*")) if p.is_file()}  # fmt: skip
