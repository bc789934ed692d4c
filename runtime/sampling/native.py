"""Fused CPU kernels for the sampler: row argmax and exact one-uniform sampling, in C.

Why C: exact inverse-CDF sampling needs the exponential of every vocabulary entry. As PyTorch
ops that is five passes over the [N, vocab] float32 scores (max, scale, exp2, chunk sums, pick)
with a 33 MB temporary: ~10 ms per step at [256, 32000] on a 2-core Zen 4, over the ~6 ms
budget of a whole step. Here one call reads each row once (``csrc/rows.h``): ~3x faster than
the PyTorch ops on one core; rows are split across torch's thread count (ctypes drops the GIL
during the call). The kernels read float32 or bfloat16 rows (bf16 widens exactly, so the tokens
are the same as from the float32 copy, which need not be made). The greedy argmax, the whole
step's sampling at temperature 0, reads each row once with AVX-512 where the build has it:
~1.5x the plain loop on data in cache. Rows with top-k / top-p go to `sample_filtered_rows`
(``csrc/filter.h``: selection by block-maximum bounds and quickselect instead of
`torch.topk`), in the same library.

The library (``csrc/sampler.c`` and the headers it includes) is built on first use with the
system C compiler (`CC`, else `cc`/`gcc`, ~0.2 s) into a cache (`pagoda.runtime.cpu.build`;
keyed by the sources, flags, compiler and CPU) and loaded with ctypes. With no compiler, a
failed build or PAGODA_NATIVE_SAMPLER=0, `available()` is False and `sampling.ops` uses its
PyTorch implementation: same distribution, different float rounding.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
from pathlib import Path

import torch
from pagoda.runtime.cpu import build, calls

log = logging.getLogger(__name__)

MIN_ROWS_PER_THREAD = 8  # smaller batches run on the calling thread
BLOCK_ROWS = 16  # rows a thread claims at a time
FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math", "-fno-math-errno", "-shared", "-fPIC"]
LOG2E = 1.4426950408889634
DTYPES = (torch.float32, torch.bfloat16)  # the logits dtypes the kernels read
SOURCE = Path(__file__).parent / "csrc" / "sampler.c"


def _build() -> Path | None:
    """The cached shared library, built if missing; None when no compiler can build it."""
    cc = build.find_compiler("CC", ["cc", "gcc"])
    if not cc:
        return None
    # 512-bit vectors where the CPU has them (GCC's -march=native tunes Intel CPUs for 256):
    # whole-vocabulary sampling ~20 % faster on the Xeon
    tuned = ["-march=native", *FLAGS]
    for flags in (["-mprefer-vector-width=512", *tuned], tuned, FLAGS):
        try:
            return build.build(
                SOURCE, name="sampler", compiler=cc, flags=flags,
                directory=build.cache_dir() / "native",
            )  # fmt: skip
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            log.info("native sampler build failed (%s): %s", " ".join(flags), e)
    return None


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("PAGODA_NATIVE_SAMPLER", "1") == "0":
        return None
    path = _build()
    if path is None:
        log.warning("no C compiler could build the native sampler; using the PyTorch sampler")
        return None
    return load(path)


def load(path: Path) -> ctypes.CDLL:
    """The library built at `path`, its functions typed (tests load other builds' too)."""
    lib = ctypes.CDLL(str(path))
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    lib.sample_rows.argtypes = [p, i32, i64, p, p, p, p, p, i64, p, i64]
    lib.argmax_rows.argtypes = [p, i32, i64, p, i64, p, i64]
    lib.sample_filtered_rows.argtypes = [p, i32, i64, p, p, p, p, p, p, p, i64, p, i64]
    lib.logprob_rows.argtypes = [p, i32, i64, p, p, i64, p, p, p, i64, p, i64]
    lib.rank_rows.argtypes = [p, i32, i64, p, p, i64, p, i64]
    fns = (lib.sample_rows, lib.argmax_rows, lib.sample_filtered_rows, lib.logprob_rows,
           lib.rank_rows)  # fmt: skip
    for fn in fns:
        fn.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernels are built and loaded (builds them on the first call)."""
    return _library() is not None


def usable(x: torch.Tensor) -> bool:
    """The kernels take 2-D float32 or bfloat16 CPU tensors."""
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 2 and available()


def _over_rows(fn, n: int, *args) -> None:
    """fn over the n rows on up to torch.get_num_threads() threads (`calls.over_blocks`)."""
    threads = max(1, min(torch.get_num_threads(), n // MIN_ROWS_PER_THREAD))
    block = max(1, min(BLOCK_ROWS, n // threads))
    if any(calls.over_blocks(fn, n, block, threads, *args)):
        raise MemoryError("native sampler: out of memory for a row buffer")


def sample_rows(
    logits: torch.Tensor,
    inv_temp: torch.Tensor,
    min_p: torch.Tensor | None,
    u: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row from softmax(logits / T) after min-p, drawn with the uniforms u; with
    `rows`, for those rows of `logits` only (read in place, not copied), the other arguments
    then per chosen row."""
    x = logits.contiguous()
    n, v = calls.row_count(rows, x.shape[0]), x.shape[1]
    scale = (inv_temp.float() * LOG2E).contiguous()
    mp = None if min_p is None else min_p.float().contiguous()
    uu = u.float().contiguous()
    out = torch.empty(n, dtype=torch.long)
    bf16 = int(x.dtype == torch.bfloat16)
    ptrs = [None if t is None else t.data_ptr() for t in (rows, scale, mp)]
    _over_rows(
        _library().sample_rows, n, x.data_ptr(), bf16, v, *ptrs, uu.data_ptr(), out.data_ptr()
    )
    return out


def sample_filtered_rows(
    logits: torch.Tensor,
    inv_temp: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    u: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row after min-p, top-k (>= vocab: off) and top-p (1: off), drawn with the
    uniforms u, without sorting the rows (see ``csrc/filter.h``); `rows` as in
    `sample_rows`."""
    x = logits.contiguous()
    n, v = calls.row_count(rows, x.shape[0]), x.shape[1]
    params = [
        rows,
        (inv_temp.float() * LOG2E).contiguous(),
        None if top_k is None else top_k.long().contiguous(),
        None if top_p is None else top_p.float().contiguous(),
        None if min_p is None else min_p.float().contiguous(),
        u.float().contiguous(),
    ]
    out = torch.empty(n, dtype=torch.long)
    ptrs = [None if t is None else t.data_ptr() for t in params]
    bf16 = int(x.dtype == torch.bfloat16)
    _over_rows(_library().sample_filtered_rows, n, x.data_ptr(), bf16, v, *ptrs, out.data_ptr())
    return out


def logprob_rows(
    logits: torch.Tensor, tokens: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`log_softmax(logits)` at each row's token [N], and (k > 0) the row's k best tokens [N, k]
    with theirs, best first (ties by index), without writing the log-softmax (see
    ``csrc/logprobs.h``)."""
    x = logits.contiguous()
    n, v = x.shape
    if not 0 <= k <= v:
        raise ValueError(f"k must be in [0, {v}], got {k}")
    t = tokens.long().contiguous()
    if t.shape != (n,) or (n and not (int(t.min()) >= 0 and int(t.max()) < v)):
        raise IndexError(f"tokens must be {n} indices below {v}")
    chosen = torch.empty(n, dtype=torch.float32)
    ids = torch.empty((n, k), dtype=torch.long) if k else None
    lps = torch.empty((n, k), dtype=torch.float32) if k else None
    ptrs = [None if a is None else a.data_ptr() for a in (ids, lps)]
    bf16 = int(x.dtype == torch.bfloat16)
    _over_rows(
        _library().logprob_rows, n, x.data_ptr(), bf16, v, None, t.data_ptr(), k,
        chosen.data_ptr(), *ptrs,
    )  # fmt: skip
    return chosen, ids, lps


def rank_rows(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Per row, the token's place in the row by value, ties by index (int64 [N]; 1 = the best;
    `ops.rank_by_index`): vLLM's rank of a sampled or prompt token, its place in the top-k lists
    whatever k is, without an [N, V] mask."""
    x = logits.contiguous()
    n, v = x.shape
    t = tokens.long().contiguous()
    if t.shape != (n,) or (n and not (int(t.min()) >= 0 and int(t.max()) < v)):
        raise IndexError(f"tokens must be {n} indices below {v}")
    rank = torch.empty(n, dtype=torch.long)
    bf16 = int(x.dtype == torch.bfloat16)
    _over_rows(_library().rank_rows, n, x.data_ptr(), bf16, v, t.data_ptr(), rank.data_ptr())
    return rank


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` (first maximum) in one pass over each row."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.long)
    args = (x.data_ptr(), int(x.dtype == torch.bfloat16), x.shape[1], out.data_ptr())
    _over_rows(_library().argmax_rows, x.shape[0], *args)
    return out
