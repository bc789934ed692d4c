"""Build small C/C++ sources once per machine and cache the shared library (loaded by ctypes).

The CPU attention kernel and the native sampler are a few C functions over raw pointers:
compiling them with the system compiler takes a second, where ``torch.utils.cpp_extension``
would compile torch's headers (~30 s). Libraries are built with ``-march=native``, so the cache
key holds the source, the flags, the compiler's version and the CPU's model and feature flags.
Cache: ``$PAGODA_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagoda`` or ``~/.cache/pagoda``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

# C side of `over_blocks`: threads share the work through *next, each claiming `block` items at a
# time, so a thread the OS deschedules on a busy machine holds up at most its current block.
CLAIM_C = """
static inline int64_t claim(int64_t *next, int64_t block, int64_t n, int64_t *end) {
    int64_t r0 = __atomic_fetch_add(next, block, __ATOMIC_RELAXED);
    *end = r0 + block < n ? r0 + block : n;
    return r0;
}
"""


def cache_dir() -> Path:
    if os.environ.get("PAGODA_CACHE_DIR"):
        return Path(os.environ["PAGODA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagoda"


def cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def find_compiler(env: str, names: Sequence[str]) -> str | None:
    """The compiler `$env` names (None if it does not exist: an explicit choice is not second-
    guessed), else the first of `names` on PATH."""
    if os.environ.get(env):
        return shutil.which(os.environ[env])
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def build(
    source: str,
    *,
    name: str,
    compiler: str,
    flags: Sequence[str],
    language: str,
    directory: Path | None = None,
) -> Path:
    """Compile `source` (``language`` "c" or "c++") into the cache unless already there; returns
    the library's path. Raises RuntimeError with the compiler's message when the build fails."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    parts = [source, " ".join(flags), version, cpu_signature()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    out_dir = directory or cache_dir()
    target = out_dir / f"{name}_{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        so = Path(tmp) / target.name
        cmd = [compiler, *flags, "-x", language, "-", "-o", str(so)]
        res = subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=300)
        if res.returncode:
            raise RuntimeError(f"compiling {name} failed:\n{res.stderr[-2000:]}")
        os.replace(so, target)  # atomic: concurrent builders agree on the file
    return target


# A pool of helper threads for short parallel calls from one caller thread, in C (`pool_run`).
# Helpers spin ~POOL_SPIN_NS after each job before sleeping on a futex, so calls that come
# every few hundred microseconds (a decode step's matmuls) wake no one; and there is no barrier:
# the caller claims work alongside the helpers (through CLAIM_C) and waits only for helpers that
# joined the job, so a helper the OS has descheduled on a busy core costs nothing. (OpenMP with
# OMP_WAIT_POLICY=PASSIVE sleeps at once and waits at a barrier for every thread: ~8 ms a call
# when the other core is busy, measured.) Needs CLAIM_C; link with -pthread.
POOL_C = r"""
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#define POOL_MAX 64
#ifndef POOL_SPIN_NS
#define POOL_SPIN_NS 200000L  /* a library may define its own before this */
#endif
typedef void (*pool_fn)(void*);
static struct { pool_fn fn; void* ctx; int gen, open, active, sleepers, started; } P;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static long pool_now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void* pool_helper(void* unused) {
    (void)unused;
    int seen = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST);
    for (;;) {
        long until = pool_now_ns() + POOL_SPIN_NS;
        int g;
        for (int i = 0; (g = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST)) == seen; ++i) {
            if ((i & 63) || pool_now_ns() < until) { __builtin_ia32_pause(); continue; }
            __atomic_add_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &P.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            __atomic_sub_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
        }
        seen = g;
        __atomic_add_fetch(&P.active, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&P.open, __ATOMIC_SEQ_CST)) P.fn(P.ctx);  // claims what is left
        __atomic_sub_fetch(&P.active, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}
// fn(ctx) on the caller and up to threads - 1 helpers; returns when every thread that joined
// is done. fn must share its work by claiming. A second caller at the same time runs alone.
static void pool_run(pool_fn fn, void* ctx, int threads) {
    if (threads < 2 || pthread_mutex_trylock(&pool_lock)) { fn(ctx); return; }
    for (; P.started < threads - 1 && P.started < POOL_MAX; ++P.started) {
        pthread_t t;
        if (pthread_create(&t, NULL, pool_helper, NULL)) break;
        pthread_detach(t);
    }
    P.fn = fn; P.ctx = ctx;
    __atomic_store_n(&P.open, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&P.gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&P.sleepers, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &P.gen, FUTEX_WAKE_PRIVATE, POOL_MAX, NULL, NULL, 0);
    fn(ctx);
    __atomic_store_n(&P.open, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&P.active, __ATOMIC_SEQ_CST)) __builtin_ia32_pause();
    pthread_mutex_unlock(&pool_lock);
}
"""


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="pagoda-native")


def over_blocks(fn: Callable[..., int], n: int, block: int, threads: int, *args) -> list[int]:
    """``fn(*args, n, next, block)`` on `threads` threads (the caller is one) that claim blocks
    of the `n` items through the shared counter `next` (see `CLAIM_C`); returns the codes.

    Unlike an OpenMP region there is no barrier: a helper the OS has not run by the time the
    caller finishes is cancelled, since every item is claimed. With OMP_WAIT_POLICY=PASSIVE on a
    busy core such a barrier costs a scheduler time slice (~8 ms measured) per call.
    ctypes releases the GIL during the call, so the helpers run in parallel."""
    counter = ctypes.c_int64(0)
    call = (*args, n, ctypes.addressof(counter), block)
    futures = [_pool(threads - 1).submit(fn, *call) for _ in range(threads - 1)]
    codes = [fn(*call)]
    return codes + [f.result() for f in futures if not f.cancel()]


def row_count(rows: torch.Tensor | None, n: int) -> int:
    """How many rows a kernel that reads `rows` (int64 indices into n rows, in place; None: all
    n) works on, after checking them: a bad index would read out of bounds."""
    if rows is None:
        return n
    if rows.dtype != torch.int64 or rows.dim() != 1 or not rows.is_contiguous():
        raise ValueError("rows must be a contiguous int64 vector")
    if rows.numel() and not (int(rows.min()) >= 0 and int(rows.max()) < n):
        raise IndexError(f"rows out of range for {n} rows")
    return rows.numel()
