"""The attention kernels compile for an H100/H200 (sm_90), checked without a GPU.

The interpreter runs what a GPU compiler refuses: an early ``return`` of an E4M3 tile inside a
constexpr ``if`` (compiled Triton type-checks every return of a function, so the FP8-cache
decode and unified kernels did not compile), and tiles too large for shared memory (float32 at
head size 256 under a 128-key config needed 287 kB, past sm_90's 227 kB; a 512-key tile, which
a config file may hold, 283 kB in the prefill kernel at head size 128). `sm90_compile.py`
compiles the launchers' kernels for sm_90 in a subprocess (Triton's bundled ``ptxas``, no CUDA
driver) and reports each kernel's shared memory, registers and spilled bytes (a spill outside
its KNOWN_SPILLS fails). The new families' variants (sinks, heads of 192, GQA 16, the experts
at gpt-oss's and DeepSeek's shapes) compile in the fast test once and in the slow one in their
other dtypes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _ptxas() -> Path | None:
    try:
        import triton.backends.nvidia as nvidia
    except ImportError:
        return None
    path = Path(nvidia.__file__).parent / "bin" / "ptxas"
    return path if path.is_file() else None


pytestmark = pytest.mark.skipif(
    _ptxas() is None, reason="Triton's NVIDIA backend with its bundled ptxas is not installed"
)


def _compile(which: str) -> None:
    """Compile sm90_compile.py's cases (`which`: --fast or --slow) for sm_90 with their
    registers: no error, shared memory within sm_90's, no register spilled outside its
    KNOWN_SPILLS."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONSAFEPATH": "1"}
    proc = subprocess.run(
        [sys.executable, "-P", str(HERE / "sm90_compile.py"), "--registers", which],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    *results, summary = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert {r["case"] for r in results} == set(summary["cases"])
    for r in results:
        assert r["error"] is None, r
        assert r["shared"] <= summary["shared_limit"], r
        assert r["registers"] <= 255, r
        assert r["spilled"] == 0 or r["case"] in summary["known_spills"], r


def test_attention_kernels_compile_for_sm90_within_shared_memory() -> None:
    _compile("--fast")


@pytest.mark.slow  # ~5 min with a cold Triton cache
def test_new_families_variants_compile_for_sm90() -> None:
    """The new families' kernels in their other dtypes and shapes: sinks in fp16 and over an
    FP8 cache, heads of 192 in fp16 and over an FP8 cache, 16 query heads per KV head, the
    experts at gpt-oss's, DeepSeek-V3's and V2-Lite's shapes under the packaged configs,
    Llama 4's chunked attention (5 query heads per KV head) in fp16 and over an FP8 cache,
    DeepSeek's latent cache (one tensor as both caches, 576 wide in 1024 lanes; bf16 and FP8,
    16 and 128 query heads), the new dense families' heads of 80, 96, 112 and 256 in bf16,
    BLOOM's ALiBi at head size 64 and StarCoder's 48 query heads on one KV head at 128."""
    _compile("--slow")
