"""The CPU attention kernel on the thread pool (csrc/pool.h): any thread count, any wave size,
late-joining helpers and concurrent callers give the same bits as one thread alone."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from pagoda.runtime.cpu import attention as cpu_attention

RERUN = "PAGODA_TEST_THREADS_RERUN"


@contextmanager
def threads(n: int):
    """torch's thread count (what the kernel is given) set to `n` for the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step(dtype: torch.dtype, h: int = 8, hkv: int = 2, d: int = 64, bs: int = 16):
    """Caches and one mixed step: long decodes (split into score tasks: > 32 blocks) and a
    prefill chunk on cached context, blocks scattered over the cache."""
    g = torch.Generator().manual_seed(3)
    seqs = [(900, 1), (610, 1), (700, 40), (33, 1)]  # (context incl. new tokens, new tokens)
    p = 4 // dtype.itemsize
    nb = sum(-(-c // bs) for c, _ in seqs) + 2
    kc = torch.zeros(hkv, nb, d // p, bs, p, dtype=dtype)
    vc = torch.zeros(hkv, nb, bs // p, d, p, dtype=dtype)
    width = max(-(-c // bs) for c, _ in seqs)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    perm, used = torch.randperm(nb, generator=g).tolist(), 0
    kernel = cpu_attention.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    for i, (c, _) in enumerate(seqs):
        n = -(-c // bs)
        tables[i, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
        k, v = (torch.randn(c, hkv, d, generator=g).to(dtype) for _ in range(2))
        slots = tables[i, torch.arange(c) // bs].long() * bs + torch.arange(c) % bs
        kernel.write_kv(k, v, kc, vc, slots)
    q = torch.randn(sum(m for _, m in seqs), h, d, generator=g).to(dtype)
    qstart = torch.tensor([0, *torch.tensor([m for _, m in seqs]).cumsum(0).tolist()])
    lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    return kernel, (q, kc, vc, tables, qstart.to(torch.int32), lens, d**-0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_threads_and_waves_do_not_change_a_bit(dtype):
    """Split waves (scores, softmax, p @ V: the phase waits) of one tile or of several, and one
    wave of everything, on 1, 2 and 7 threads (more than this machine's cores: helpers join
    late and claim what is left). Repeated: a phase run before the last one ends would race."""
    kernel, args = step(dtype)
    with threads(1):
        want = kernel.attention(*args)
    for nt in (2, 7):
        with threads(nt):
            for wave in (1 << 14, 1 << 17, cpu_attention.WAVE):
                for _ in range(5):
                    assert torch.equal(kernel.attention(*args, wave=wave), want), (nt, wave)


def test_concurrent_callers_get_the_same_bits():
    """A second caller while the pool is busy runs alone (pool_run's try-lock): same result."""
    kernel, args = step(torch.bfloat16)
    with threads(2):
        want = kernel.attention(*args)
        with ThreadPoolExecutor(3) as ex:
            outs = list(ex.map(lambda _: kernel.attention(*args, wave=1 << 14), range(12)))
    assert all(torch.equal(o, want) for o in outs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_kv_on_threads_matches_one_thread(dtype):
    """Over 64 tokens the cache writes are shared out by claims; negative slots are skipped."""
    g = torch.Generator().manual_seed(5)
    hkv, d, bs, nb, t = 3, 64, 16, 40, 300
    p = 4 // dtype.itemsize
    kernel = cpu_attention.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    k, v = (torch.randn(t, hkv, d, generator=g).to(dtype) for _ in range(2))
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[::7] = -1
    caches = []
    for nt in (1, 2, 7):
        kc = torch.zeros(hkv, nb, d // p, bs, p, dtype=dtype)
        vc = torch.zeros(hkv, nb, bs // p, d, p, dtype=dtype)
        with threads(nt):
            kernel.write_kv(k, v, kc, vc, slots)
        caches.append((kc, vc))
    for kc, vc in caches[1:]:
        assert torch.equal(kc, caches[0][0]) and torch.equal(vc, caches[0][1])
    assert caches[0][0].count_nonzero() > 0


def test_the_avx512_loops_on_threads_too():
    """Where AMX runs the bf16 rows: this file again with PAGODA_CPU_AMX=0 (what Zen 4 runs)."""
    kernel = cpu_attention.load()
    if os.environ.get(RERUN) == "1" or kernel is None or not kernel.uses_amx:
        pytest.skip("the bf16 rows already take the AVX-512 loops here")
    env = {**os.environ, cpu_attention.AMX_SWITCH: "0", RERUN: "1"}
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    res = subprocess.run([*cmd, str(Path(__file__))], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:]
