"""Fused CPU kernels for the sampler: row argmax and exact one-uniform sampling, in C.

Why C: exact inverse-CDF sampling needs the exponential of every vocabulary entry. As PyTorch
ops that is five passes over the [N, vocab] float32 scores (max, scale, exp2, chunk sums, pick)
with a 33 MB temporary: ~10 ms per step at [256, 32000] on a 2-core Zen 4, over the ~6 ms
budget of a whole step. Here one call reads each row once: per 256-entry chunk, its maximum and
its sum of exp2 relative to the running maximum while the chunk is in L1 (rescaled to the row
maximum at the end, as online softmax does), then a walk of the cumulative sums picks the chunk
and the token. ~3x faster than the PyTorch ops on one core; rows are split across torch's
thread count (ctypes drops the GIL during the call). The kernels read float32 or bfloat16 rows
(bf16 widens exactly, so the tokens are the same as from the float32 copy, which need not be made).

The source is built on first use with the system C compiler (`CC`, else `cc`/`gcc`, ~0.2 s) into
a cache (see `_cache_dir`; keyed by source, flags and CPU) and loaded with ctypes. With no
compiler, a failed build or PAGODA_NATIVE_SAMPLER=0, `available()` is False and `sampler_ops`
uses its PyTorch implementation: same distribution, different float rounding.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MIN_ROWS_PER_THREAD = 8  # smaller batches run on the calling thread
BLOCK_ROWS = 16  # rows a thread claims at a time
FLAGS = ["-O3", "-fopenmp-simd", "-fno-trapping-math", "-fno-math-errno", "-shared", "-fPIC"]
LOG2E = 1.4426950408889634
CHUNK = 256  # entries per chunk (CH in C); at 128, per-chunk reductions cost ~25% more
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}  # the logits dtypes the kernels read

COMMON = r"""
#include <stdint.h>
#include <stdlib.h>
#define CH @CHUNK@
#define NEG_INF (-__builtin_inff())

/* bfloat16 is the upper half of a float32: widening is exact */
static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t i; float f; } u = {(uint32_t)h << 16};
    return u.f;
}

/* 2^y to ~1e-7 relative error for y <= 0 (0 below 2^-127): 2^round(y) from the exponent bits
   times a minimax polynomial of the fraction in [-0.5, 0.5]. Inline, so the loops vectorise. */
static inline float exp2_neg(float y) {
    y = y > -127.0f ? y : -127.0f;
    float n = __builtin_floorf(y + 0.5f), f = y - n;
    float p = 1.5345810970757157e-04f;
    p = p * f + 1.3399930903688073e-03f;
    p = p * f + 9.6184890717267990e-03f;
    p = p * f + 5.5503286421298980e-02f;
    p = p * f + 2.4022646248340607e-01f;
    p = p * f + 6.9314718246459961e-01f;
    p = p * f + 1.0f;
    union { int32_t i; float f; } scale = {((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* The entry whose cumulative interval holds target (acc: the mass before w[0]); rounding never
   picks an entry of weight zero; -1 when every weight is zero. */
static int64_t pick(const float *w, int64_t n, double target, double *acc) {
    int64_t last = -1;
    for (int64_t j = 0; j < n; j++) {
        if (w[j] > 0.0f) {
            last = j;
            if (*acc + w[j] > target) return j;
            *acc += w[j];
        }
    }
    return last;
}

/* Threads share the rows through *next: each claims `block` rows at a time, so one thread that
   the OS deschedules on a busy machine holds up at most its current block. */
static int64_t claim(int64_t *next, int64_t block, int64_t n, int64_t *end) {
    int64_t r0 = __atomic_fetch_add(next, block, __ATOMIC_RELAXED);
    *end = r0 + block < n ? r0 + block : n;
    return r0;
}
"""

# Row kernels, instantiated per element type: @T@ the C type, @S@ the suffix, LD( the load.
ROWS = r"""
static float span_max_@S@(const @T@ *x, int64_t n) {
    float m = NEG_INF;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) m = LD(x[j]) > m ? LD(x[j]) : m;
    return m;
}

/* First index of the row maximum (as torch.argmax): chunk maxima, then inside the best chunk. */
static int64_t row_argmax_@S@(const @T@ *row, int64_t v) {
    float best = NEG_INF;
    int64_t at = 0;
    for (int64_t lo = 0; lo < v; lo += CH) {
        float m = span_max_@S@(row + lo, v - lo < CH ? v - lo : CH);
        if (m > best) { best = m; at = lo; }
    }
    while (at < v - 1 && LD(row[at]) != best) at++;
    return at;
}

/* Sum of 2^(x*s + b) over n entries, straight from x: nothing is stored. */
static float span_sum_@S@(const @T@ *x, int64_t n, float s, float b) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; j++) acc += exp2_neg(LD(x[j]) * s + b);
    return acc;
}

/* Chunk sums of 2^((x - max) * s) in one pass over the row (no min-p): each chunk is summed
   relative to the running maximum while it is in L1, and rescaled to the row maximum at the end. */
static double online_sums_@S@(const @T@ *x, int64_t v, float s, float *sums, float *maxes,
                          float *row_max) {
    float m = NEG_INF;
    int64_t nc = 0;
    for (int64_t lo = 0; lo < v; lo += CH, nc++) {
        int64_t len = v - lo < CH ? v - lo : CH;
        float cm = span_max_@S@(x + lo, len);
        m = cm > m ? cm : m;
        maxes[nc] = m;
        /* a chunk whose best weight underflows (2^-127 and below are 0 here) sums to 0 */
        sums[nc] = (cm - m) * s > -127.0f ? span_sum_@S@(x + lo, len, s, -m * s) : 0.0f;
    }
    double total = 0.0;
    for (int64_t c = 0; c < nc; c++) {
        sums[c] *= exp2_neg((maxes[c] - m) * s);
        total += sums[c];
    }
    *row_max = m;
    return total;
}

/* Weights 2^(x*s + b), zeroed below mp; returns their per-chunk sums and the total. */
static double row_weights_@S@(const @T@ *restrict x, int64_t v, float s, float b, float mp,
                          float *restrict w, float *restrict sums) {
#pragma omp simd
    for (int64_t j = 0; j < v; j++) {
        float e = exp2_neg(LD(x[j]) * s + b);
        w[j] = e >= mp ? e : 0.0f;
    }
    double total = 0.0;
    int64_t full = v / CH, c = 0;
    for (; c < full; c++) {
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < CH; j++) acc += w[c * CH + j];
        sums[c] = acc;
        total += acc;
    }
    if (v % CH) {
        float acc = 0.0f;
        for (int64_t j = full * CH; j < v; j++) acc += w[j];
        sums[c] = acc;
        total += acc;
    }
    return total;
}

/* Row r of x [n, v]: a token from weights 2^((x - max) * s) (weights below mp dropped) with the
   uniform u; a row with no finite weight gets its argmax. w: v + 2 * chunks floats of scratch. */
static int64_t sample_row_@S@(const @T@ *row, int64_t v, float s, float mp, float u, float *w) {
    int64_t nc = (v + CH - 1) / CH;
    float *sums = w + v, *maxes = sums + nc, m;
    double total;
    if (mp > 0.0f) {
        m = span_max_@S@(row, v);
        total = row_weights_@S@(row, v, s, -m * s, mp, w, sums);
    } else {
        total = online_sums_@S@(row, v, s, sums, maxes, &m);
    }
    double acc = 0.0, target = u * total;
    int64_t c = total > 0.0 && total < __builtin_inf() ? pick(sums, nc, target, &acc) : -1;
    int64_t at = -1;
    if (c >= 0) {
        int64_t lo = c * CH, len = v - lo < CH ? v - lo : CH;
        float chunk_sum; /* the online pass stored no weights: the chosen chunk's, now */
        if (mp <= 0.0f) row_weights_@S@(row + lo, len, s, -m * s, 0.0f, w + lo, &chunk_sum);
        at = pick(w + lo, len, target, &acc);
    }
    return at < 0 ? row_argmax_@S@(row, v) : c * CH + at;
}

int sample_rows_@S@(const @T@ *x, int64_t v, const float *scale, const float *min_p,
                const float *u, int64_t *out, int64_t n, int64_t *next, int64_t block) {
    float *w = malloc(sizeof(float) * (size_t)(v + 2 * ((v + CH - 1) / CH)));
    if (!w) return -1;
    for (int64_t r, end; (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++)
            out[r] = sample_row_@S@(x + r * v, v, scale[r], min_p ? min_p[r] : 0.0f, u[r], w);
    free(w);
    return 0;
}

int argmax_rows_@S@(const @T@ *x, int64_t v, int64_t *out, int64_t n, int64_t *next,
                int64_t block) {
    for (int64_t r, end; (r = claim(next, block, n, &end)) < n;)
        for (; r < end; r++) out[r] = row_argmax_@S@(x + r * v, v);
    return 0;
}
"""


def _instance(ctype: str, suffix: str, load: str) -> str:
    return ROWS.replace("@T@", ctype).replace("@S@", suffix).replace("LD(", load + "(")


SOURCE = (
    COMMON.replace("@CHUNK@", str(CHUNK))
    + _instance("float", "f32", "")
    + _instance("uint16_t", "bf16", "bf16_to_f32")
)


def _cpu_key() -> str:
    """What -march=native depends on: the architecture and the CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def _cache_dir() -> Path:
    """$PAGODA_CACHE_DIR/native, else under $XDG_CACHE_HOME/pagoda or ~/.cache/pagoda."""
    if os.environ.get("PAGODA_CACHE_DIR"):
        return Path(os.environ["PAGODA_CACHE_DIR"]) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pagoda" / "native"


def _compile(cc: str, flags: list[str], target: Path) -> bool:
    """Build SOURCE into `target` atomically (concurrent processes may race to build it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [cc, *flags, "-x", "c", "-", "-o", tmp]
        done = subprocess.run(cmd, input=SOURCE, text=True, capture_output=True, timeout=120)
        if done.returncode != 0:
            log.info("native sampler build failed (%s): %s", " ".join(flags), done.stderr[-500:])
            return False
        os.replace(tmp, target)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build() -> Path | None:
    """The cached shared library, built if missing; None when no compiler can build it."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    for flags in (["-march=native", *FLAGS], FLAGS):
        key = hashlib.sha256("\n".join([SOURCE, cc, *flags, _cpu_key()]).encode()).hexdigest()
        path = _cache_dir() / f"sampler-{key[:20]}.so"
        try:
            if path.exists() or _compile(cc, flags, path):
                return path
        except (OSError, subprocess.SubprocessError) as e:
            log.info("native sampler build failed: %s", e)
    return None


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("PAGODA_NATIVE_SAMPLER", "1") == "0":
        return None
    path = _build()
    if path is None:
        log.warning("no C compiler could build the native sampler; using the PyTorch sampler")
        return None
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for suffix in SUFFIX.values():
        sample, argmax = (
            getattr(lib, f"sample_rows_{suffix}"),
            getattr(lib, f"argmax_rows_{suffix}"),
        )
        sample.argtypes = [p, i64, p, p, p, p, i64, p, i64]
        argmax.argtypes = [p, i64, p, i64, p, i64]
        sample.restype = argmax.restype = ctypes.c_int
    return lib


def available() -> bool:
    """Whether the kernels are built and loaded (builds them on the first call)."""
    return _library() is not None


def usable(x: torch.Tensor) -> bool:
    """The kernels take 2-D float32 or bfloat16 CPU tensors."""
    return x.device.type == "cpu" and x.dtype in SUFFIX and x.dim() == 2 and available()


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="pagoda-sampler")


def _over_rows(fn, n: int, *args) -> None:
    """fn(*args, n, next, block) on up to torch.get_num_threads() threads that claim blocks of
    rows through the shared counter `next` (the calling thread is one of them)."""
    threads = max(1, min(torch.get_num_threads(), n // MIN_ROWS_PER_THREAD))
    block = max(1, min(BLOCK_ROWS, n // threads))
    counter = ctypes.c_int64(0)
    call = (*args, n, ctypes.addressof(counter), block)
    futures = [_pool(threads - 1).submit(fn, *call) for _ in range(threads - 1)]
    codes = [fn(*call)]
    # a helper the OS has not run yet by now is not waited for: the rows are all claimed
    codes += [f.result() for f in futures if not f.cancel()]
    if any(codes):
        raise MemoryError("native sampler: out of memory for a row buffer")


def sample_rows(
    logits: torch.Tensor, inv_temp: torch.Tensor, min_p: torch.Tensor | None, u: torch.Tensor
) -> torch.Tensor:
    """One token per row from softmax(logits / T) after min-p, drawn with the uniforms u."""
    x = logits.contiguous()
    n, v = x.shape
    scale = (inv_temp.float() * LOG2E).contiguous()
    mp = None if min_p is None else min_p.float().contiguous()
    uu = u.float().contiguous()
    out = torch.empty(n, dtype=torch.long)
    args = (x.data_ptr(), v, scale.data_ptr(), None if mp is None else mp.data_ptr())
    kernel = getattr(_library(), f"sample_rows_{SUFFIX[x.dtype]}")
    _over_rows(kernel, n, *args, uu.data_ptr(), out.data_ptr())
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)` (first maximum) in one pass over each row."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.long)
    kernel = getattr(_library(), f"argmax_rows_{SUFFIX[x.dtype]}")
    _over_rows(kernel, x.shape[0], x.data_ptr(), x.shape[1], out.data_ptr())
    return out
