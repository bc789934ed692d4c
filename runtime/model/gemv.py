"""bf16 GEMV/GEMM over oneDNN's packed weights, read in place, with rows independent of M.

A decode step of a few sequences multiplies a handful of rows by every weight of the model: it
is bound by memory bandwidth, and oneDNN's GEMM streams the weights slower than a plain AVX-512
BF16 loop (on the 2-core Xeon ~11-16 GB/s on AMX against ~21-25), and each of its calls wakes
OpenMP threads (~50 us, a whole scheduler slice when the other core is busy) where this kernel's
pool (`native.POOL_C`) wakes no one between back-to-back calls. The loop reads the copy that
`Linear` already packed for oneDNN (layout ``AB16b{nb}a2b``: blocks of nb outputs by 32 inputs,
pairs of inputs interleaved as AVX-512 BF16 wants them), so weights take no extra memory. The
layout is checked on a probe weight when the library loads; anything unexpected turns it off.

Each output is one float32 accumulator updated pair by pair in key order, in tiles of up to 6
rows, so a row's bits depend neither on M, nor on its place in a tile, nor on the threads. On
CPUs without AMX (AMD Zen 4) it therefore takes every bf16 matmul, prefill included: as fast as
oneDNN's ``avx512_core_bf16`` GEMM at large M and faster at decode sizes (docs/benchmarks.md),
and the batch-invariance guarantee holds as with oneDNN. Where oneDNN runs on AMX tiles and the
AMX GEMM (`amx_gemm`) is off, it takes steps of up to `MAX_ROWS` rows only (oneDNN is faster
above, and not M-invariant there anyway). ``PAGODA_CPU_GEMV=0`` turns it off.

Runs of 19-48 rows (decode steps of that many sequences) sweep each weight block in chunks of
keys through all their tiles, prefetching the next chunk, so memory and arithmetic overlap; the
accumulators wait between chunks in float32, so the bits are those of the plain tiles.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
from pagoda.runtime import native

log = logging.getLogger(__name__)

ENV_SWITCH = "PAGODA_CPU_GEMV"
MAX_ROWS = 4  # rows the C kernel takes (at 8, oneDNN's AMX tiles were as fast)
K_BLOCK = 32  # inputs per packed block (16 pairs)
SERIAL_BELOW = 1 << 18  # weights of fewer elements run on the calling thread alone
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-ffp-contract=off"]

# Rows [lo, hi) in tiles of RMAX (= 6) then one of the rest: CALL(R) for each, `m` its first row.
ROW_TILES_C = r"""
#define ROW_TILES(CALL)                         \
  int64_t m = lo;                               \
  for (; m + RMAX <= hi; m += RMAX) CALL(RMAX); \
  switch (hi - m) {                             \
    case 1: CALL(1); break;                     \
    case 2: CALL(2); break;                     \
    case 3: CALL(3); break;                     \
    case 4: CALL(4); break;                     \
    case 5: CALL(5); break;                     \
  }
"""

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
@CLAIM@
@POOL@
#ifdef __AVX512BF16__
// y[m, n] = bf16(sum_k x[m, k] w[n, k] + bias[n]), weights in oneDNN's AB16b{nb}a2b layout
// (nb = 16 * V outputs per block). Each output is one float accumulator updated pair by pair in
// key order: its bits depend neither on M, nor on the tile a row lands in, nor on the threads.
struct Job {
  const uint16_t *w, *bias; const uint32_t* xp; uint16_t* y;
  int64_t ldxp, ldy, next, claim;  // ldxp: row stride of xp in pairs
  int M, N, K, MC;                 // MC: rows per task
};

#define INLINE static inline __attribute__((always_inline))

// acc += rows m0.. of x by block nb over key pairs [kp0, kp1), pair by pair in key order; the
// first `lines` iterations each prefetch one cache line from `pf`
template <int V, int R>
INLINE void accumulate(const Job& j, int64_t nb, int64_t m0, int kp0, int kp1,
                       __m512 (&acc)[R][V], const char* pf, int lines) {
  const int64_t blk = 32 * 16 * V;  // bf16 values per (n-block, k-block)
  const uint16_t* wb = j.w + nb * ((j.K + 31) / 32) * blk;
  const uint32_t* xp = j.xp + m0 * j.ldxp;
  for (int kp = kp0; kp < kp1; ++kp) {
    const uint16_t* wp = wb + (int64_t)(kp / 16) * blk + (kp % 16) * 32 * V;
    __m512bh b[V];
    for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(wp + 32 * v);
    if (kp - kp0 < lines) _mm_prefetch(pf + (int64_t)(kp - kp0) * 64, _MM_HINT_T0);
    for (int m = 0; m < R; ++m) {
      __m512bh a = (__m512bh)_mm512_set1_epi32((int)xp[m * j.ldxp + kp]);
      for (int v = 0; v < V; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, b[v]);
    }
  }
}

template <int V, int R>  // the tile's outputs: accumulators (+ bias) rounded to bf16
INLINE void store(const Job& j, int64_t nb, int64_t m0, __m512 (&acc)[R][V]) {
  for (int v = 0; v < V; ++v) {
    const int64_t n0 = nb * 16 * V + 16 * v;
    if (n0 >= j.N) break;
    const __mmask16 mask =
        j.N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (j.N - n0)) - 1);
    __m512 bv = _mm512_setzero_ps();
    if (j.bias) bv = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, j.bias + n0)), 16));
    for (int m = 0; m < R; ++m) {
      __m256i o = (__m256i)_mm512_cvtneps_pbh(j.bias ? _mm512_add_ps(acc[m][v], bv) : acc[m][v]);
      _mm256_mask_storeu_epi16(j.y + (m0 + m) * j.ldy + n0, mask, o);
    }
  }
}

// R rows from m0 by the 16 * V outputs of block nb over key pairs [kp0, kp1), accumulating in
// registers: all keys at once (kp0 = 0, kp1 = KP), or one chunk, the accumulators then carried
// in `buf` (float32: exact) from chunk to chunk; the last chunk writes the outputs.
template <int V, int R>
static void tile(const Job& j, int64_t nb, int64_t m0, int kp0, int kp1, float* buf,
                       const char* pf, int lines) {
  __m512 acc[R][V];
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < V; ++v)
      acc[m][v] = kp0 ? _mm512_load_ps(buf + (m * V + v) * 16) : _mm512_setzero_ps();
  accumulate<V, R>(j, nb, m0, kp0, kp1, acc, pf, lines);
  if (kp1 == (j.K + 31) / 32 * 16) return store<V, R>(j, nb, m0, acc);
  for (int m = 0; m < R; ++m)
    for (int v = 0; v < V; ++v) _mm512_store_ps(buf + (m * V + v) * 16, acc[m][v]);
}

constexpr int RMAX = 6;  // rows per tile: 6 x 4 accumulators + 4 weight registers fit in 32
constexpr int KCHUNK = 64;  // key pairs a block's weights are swept in (V = 4: 16 KB, in L1)
// Runs of rows swept chunk by chunk (below: up to three tiles, too little to overlap; above: the
// arithmetic dominates and chunking measured 5 % slower at 64 rows on a Zen 5)
constexpr int CHUNK_MIN_ROWS = 19, CHUNK_MAX_ROWS = 48;

@ROW_TILES@

// tasks = (n-block, run of MC rows), n-block major: its weights stay in L2. Tile by tile, a
// block's first tile waits on memory for all its weights and the others compute from L2 with
// memory idle; a run of CHUNK_MIN_ROWS..CHUNK_MAX_ROWS rows instead sweeps the keys in chunks,
// every tile through a chunk before the next while they prefetch the next chunk (the next
// block's first at the end), so the weights stream in step with the arithmetic (decode steps of
// 24-32 sequences 7-10 % faster on a Zen 5). The bits are the same either way.
template <int V>
static void run(void* arg) {
  Job& j = *(Job*)arg;
  const int64_t nblk = (j.N + 16 * V - 1) / (16 * V), mch = (j.M + j.MC - 1) / j.MC;
  const int64_t tasks = nblk * mch;
  const int KP = (j.K + 31) / 32 * 16;
  const int64_t block = (int64_t)KP * 64 * V;  // bytes of a block's weights
  alignas(64) float buf[16 * RMAX * 16 * V];  // MC rows by 16 V outputs
  for (int64_t t, end; (t = claim(&j.next, j.claim, tasks, &end)) < tasks;)
    for (; t < end; ++t) {
      const int64_t nb = t / mch, lo = t % mch * j.MC, hi = lo + j.MC < j.M ? lo + j.MC : j.M;
      if (hi - lo < CHUNK_MIN_ROWS || hi - lo > CHUNK_MAX_ROWS) {
#define WHOLE(R) tile<V, R>(j, nb, m, 0, KP, nullptr, nullptr, 0)
        ROW_TILES(WHOLE)
        continue;
      }
      const int tiles = (int)((hi - lo + RMAX - 1) / RMAX);
      const char* wb = (const char*)j.w + nb * block;
      for (int kp0 = 0; kp0 < KP; kp0 += KCHUNK) {
        const int kp1 = kp0 + KCHUNK < KP ? kp0 + KCHUNK : KP;
        const bool last = kp1 == KP;  // then prefetch the next block's first chunk, if any
        const char* next = last ? wb + block : wb + (int64_t)kp1 * 64 * V;
        const int per_tile = last && nb + 1 == nblk ? 0 : (KCHUNK * V + tiles - 1) / tiles;  // lines
        int ti = 0;
#define CHUNK(R) tile<V, R>(j, nb, m, kp0, kp1, buf + (m - lo) * 16 * V, \
                                  next + (int64_t)(ti++) * per_tile * 64, per_tile)
        ROW_TILES(CHUNK)
      }
    }
}
#endif

// y [M, N] = x [M, K] @ w^T (+ bias) on `threads` threads of the pool (see native.POOL_C).
extern "C" int pagoda_gemv_bf16(const uint16_t* w, int nb, const uint16_t* x, int64_t ldx,
                                uint16_t* y, int64_t ldy, const uint16_t* bias, int M, int N,
                                int K, int threads) {
#ifdef __AVX512BF16__
  if (M < 1 || (nb != 16 && nb != 32 && nb != 64)) return 1;
  const int KP = (K + 31) / 32 * 16;
  const int64_t nblocks = (N + nb - 1) / nb;
  const uint32_t* xp = (const uint32_t*)x;
  uint32_t* copy = nullptr;
  int64_t ldxp = ldx / 2;
  if (K % 32 || ldx % 2 || (uintptr_t)x % 4) {  // rows as pairs, zero-padded to whole blocks
    copy = (uint32_t*)malloc((size_t)M * KP * 4);
    if (!copy) return 3;
    for (int m = 0; m < M; ++m) {
      uint16_t* row = (uint16_t*)(copy + (int64_t)m * KP);
      memcpy(row, x + m * ldx, (size_t)K * 2);
      memset(row + K, 0, (size_t)(KP * 2 - K) * 2);
    }
    xp = copy, ldxp = KP;
  }
  const int MC = M <= 4 * RMAX ? M : 16 * RMAX;
  const int64_t tasks = nblocks * ((M + MC - 1) / MC);
  // ~8 claims a thread: a late or descheduled helper leaves little for the others
  const int64_t claim_tasks = tasks / (8 * (threads > 0 ? threads : 1));
  Job job{w, bias, xp, y, ldxp, ldy, 0, claim_tasks > 0 ? claim_tasks : 1, M, N, K, MC};
  pool_run(nb == 16 ? run<1> : nb == 32 ? run<2> : run<4>, &job, threads);
  free(copy);
  return 0;
#else
  return 2;
#endif
}
"""


def blocked_offsets(n: int, k: int, nb: int) -> torch.Tensor:
    """Where w[i, j] sits in the ``AB16b{nb}a2b`` layout (padded to whole blocks), as [n, k]."""
    i, j = torch.arange(n)[:, None], torch.arange(k)[None, :]
    kblocks = -(-k // K_BLOCK)
    return (
        ((i // nb) * kblocks + j // K_BLOCK) * K_BLOCK * nb
        + ((j % 32) // 2 * nb + i % nb) * 2
        + j % 2
    )


def packed_nbytes(n: int, k: int, nb: int) -> int:
    return -(-n // nb) * nb * -(-k // K_BLOCK) * K_BLOCK * 2


def _raw(packed: torch.Tensor) -> torch.Tensor:
    """The bytes of an opaque oneDNN tensor, copied into a plain bf16 tensor."""
    size = torch.ops.mkldnn._nbytes(packed)
    out = torch.empty(size // 2, dtype=torch.bfloat16)
    ctypes.memmove(out.data_ptr(), torch.ops.mkldnn.data_ptr(packed), size)
    return out


def probe_layout(pack) -> int | None:
    """The block width nb for which `pack` (weight -> oneDNN packed tensor) lays out an exactly
    representable probe weight as ``AB16b{nb}a2b``; None if it is none of them."""
    n, k = 100, 70  # padded in both dimensions
    want = torch.arange(n * k, dtype=torch.float32).view(n, k) % 251 + 1  # exact in bf16
    raw = _raw(pack(want.to(torch.bfloat16))).float()
    for nb in (16, 32, 64):
        if raw.numel() != packed_nbytes(n, k, nb) // 2:
            continue
        expect = torch.zeros(raw.numel())
        expect[blocked_offsets(n, k, nb).reshape(-1)] = want.reshape(-1)
        if torch.equal(raw, expect):
            return nb
    return None


class Gemv:
    """The compiled GEMV and the packed layout it reads (see the module docstring)."""

    def __init__(self, lib: ctypes.CDLL, nb: int) -> None:
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pagoda_gemv_bf16.argtypes = [p, i32, p, i64, p, i64, p, i32, i32, i32, i32]
        lib.pagoda_gemv_bf16.restype = i32
        self.fn, self.nb = lib.pagoda_gemv_bf16, nb

    def accepts(self, packed: torch.Tensor, n: int, k: int) -> bool:
        """Whether a packed weight has the layout this GEMV reads (its size says so)."""
        return torch.ops.mkldnn._nbytes(packed) == packed_nbytes(n, k, self.nb)

    def bind(self, packed: torch.Tensor, bias: torch.Tensor | None) -> GemvWeight:
        return GemvWeight(self, packed, bias)


class PackedWeight:
    """One oneDNN-packed bf16 weight (kept alive here) bound to a C kernel, with what each call
    passes for it worked out once; the kernels' wrappers subclass it."""

    __slots__ = ("bias", "bias_ptr", "fn", "k", "n", "packed", "ptr")

    def __init__(self, fn, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.fn, self.packed = fn, packed
        self.n, self.k = packed.shape
        self.ptr = torch.ops.mkldnn.data_ptr(packed)
        self.bias = None if bias is None else bias.to(torch.bfloat16).contiguous()
        self.bias_ptr = None if self.bias is None else self.bias.data_ptr()


class GemvWeight(PackedWeight):
    __slots__ = ("nb",)

    def __init__(self, gemv: Gemv, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(gemv.fn, packed, bias)
        self.nb = gemv.nb

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16."""
        m = x.shape[0]
        if x.stride(1) != 1:
            x = x.contiguous()
        y = torch.empty(m, self.n, dtype=torch.bfloat16)
        # a helper thread costs ~20-50 us to wake: worth it from ~1 MB of weights (at M = 1)
        threads = torch.get_num_threads() if self.n * self.k * m >= SERIAL_BELOW else 1
        args = (self.ptr, self.nb, x.data_ptr(), x.stride(0), y.data_ptr(), self.n)
        args += (self.bias_ptr, m, self.n, self.k)
        rc = self.fn(*args, threads)
        if rc:
            raise RuntimeError(f"CPU GEMV failed (code {rc}) for {m}x{self.k} @ {self.n}x{self.k}")
        return y


def onednn_uses_amx() -> bool:
    """Whether oneDNN runs bf16 GEMMs on AMX tiles here: the CPU has them and oneDNN is not
    limited to an ISA without them (``ONEDNN_MAX_CPU_ISA``). Its rows are then not M-invariant."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    return ("AMX" in isa or isa in ("ALL", "DEFAULT")) and "amx_bf16" in native.cpu_signature()


def wanted() -> bool:
    """``PAGODA_CPU_GEMV``: on unless ``0`` (``1`` and ``auto``, the default, mean on)."""
    choice = os.environ.get(ENV_SWITCH, "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"{ENV_SWITCH} must be auto, 0 or 1, got {choice!r}")
    return choice != "0"


def max_rows() -> int:
    """The row counts the kernel takes: all of them where oneDNN's bf16 GEMM is M-invariant (no
    AMX), since the kernel is M-invariant too and replaces oneDNN whole; where oneDNN runs on
    AMX tiles (faster from a few rows on, and not M-invariant anyway) decode steps only."""
    return MAX_ROWS if onednn_uses_amx() else 1 << 62


def build(source: str, name: str, compiler: str):
    """Compile a kernel source of this family (this module's `SOURCE`, `amx_gemm`'s, `qgemm`'s,
    or an older revision's for an A/B) with the pool, claim and row-tile code spliced in; returns
    the library path."""
    source = source.replace("@CLAIM@", native.CLAIM_C).replace("@POOL@", native.POOL_C)
    source = source.replace("@ROW_TILES@", ROW_TILES_C)
    return native.build(source, name=name, compiler=compiler, flags=FLAGS, language="c++")


@functools.cache
def load(pack) -> Gemv | None:
    """The GEMV for weights packed by `pack`, or None (not buildable, or oneDNN's layout is not
    the one it reads)."""
    compiler = native.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        path = build(SOURCE, "gemv", compiler)
        nb = probe_layout(pack)
        if nb is None:
            log.warning("CPU GEMV off: oneDNN's packed bf16 layout is not AB16b{16,32,64}a2b")
            return None
        gemv = Gemv(ctypes.CDLL(str(path)), nb)
    except (OSError, RuntimeError, AttributeError) as exc:
        log.warning("CPU GEMV unavailable, decode rows use oneDNN: %s", exc)
        return None
    return gemv if agrees_with_onednn(gemv, pack, 3, "CPU GEMV") else None


def agrees_with_onednn(kernel: Gemv, pack, rows: int, what: str) -> bool:
    """`kernel` (anything with ``bind(packed, bias)``) against oneDNN on a shape padded in N and
    K, with `rows` rows (bf16 tolerance: the summation orders differ); a load-time check."""
    g = torch.Generator().manual_seed(0)
    n, k = 200, 100
    w = (torch.randn(n, k, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16)
    packed = pack(w)
    want = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "").float()
    got = kernel.bind(packed, bias)(x)
    if got.shape == want.shape and torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2):
        return True
    log.warning("%s off: it disagrees with oneDNN on a probe (layout changed?)", what)
    return False
