"""Building, caching and choosing the CPU attention kernel; both CPU paths end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attention_testlib import scattered_tables
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.cpu import attention as cpu_attention
from pagoda.runtime.cpu import build as builder


@pytest.fixture(scope="module", params=["native", "avx2"])
def kernel(request) -> cpu_attention.CpuKernel:
    """The kernel built for this CPU, and built for AVX2 + FMA without AVX-512 (the loops of
    csrc/attention/avx2.h, which AVX-512 machines never build natively): both pass the same checks."""
    if request.param == "native":
        built = cpu_attention.load()
        assert built is not None, "the CPU attention kernel did not build (is g++ installed?)"
        return built
    cxx = builder.find_compiler("CXX", ["g++", "c++", "clang++"])
    if cxx is None or not {"avx2", "fma"} <= set(builder.cpu_signature().split()):
        pytest.skip("no C++ compiler, or this CPU cannot run AVX2 + FMA code")
    flags = ["-march=haswell" if f == "-march=native" else f for f in cpu_attention.FLAGS]
    path = builder.build(
        cpu_attention.SOURCE, name="paged_attention_avx2", compiler=cxx, flags=flags
    )
    return cpu_attention.CpuKernel(path)


@pytest.mark.slow
def test_build_compiles_once_per_cache_dir_and_loads(tmp_path):
    first = cpu_attention.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = cpu_attention.build(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # cached, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left
    assert cpu_attention.CpuKernel(first).lib.pagoda_attention is not None


def test_without_a_compiler_the_build_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        cpu_attention.build(tmp_path / "cache")


def test_the_switch_picks_the_path_and_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "torch")
    assert cpu_attention.load() is None
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "sdpa")
    with pytest.raises(ValueError, match="kernel or torch"):
        cpu_attention.load()


@pytest.mark.slow
def test_both_paths_generate_the_same_greedy_tokens_in_float32(smol, corpus_ids, monkeypatch):
    """The engine end to end on each path: float32 keeps their rounding differences far below
    the gaps between top logits, so greedy tokens agree (prefill chunks and decodes included)."""
    prompts = [corpus_ids[:40], corpus_ids[100:400], corpus_ids[50:51]]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for path, rank in (("kernel", 5), ("torch", 4)):  # the packed layout, or head-major
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, path)
        llm = LLM(loaded=smol, dtype="float32", max_model_len=512, max_num_batched_tokens=128)
        assert llm.engine.runner.kv_caches[0][0].dim() == rank
        tokens[path] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
        del llm
    assert tokens["kernel"] == tokens["torch"]


def test_a_block_outside_the_cache_is_an_error_not_a_stray_read():
    kernel = cpu_attention.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    kc = torch.zeros(2, 8, 16, 16, 2, dtype=torch.bfloat16)  # 8 blocks of 16, D = 32
    vc = torch.zeros(2, 8, 8, 32, 2, dtype=torch.bfloat16)
    q = torch.zeros(1, 4, 32, dtype=torch.bfloat16)
    qstart, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    ok = torch.tensor([[3, 7]], dtype=torch.int32)
    assert kernel.attention(q, kc, vc, ok, qstart, lens, 0.1).shape == (1, 4, 32)
    with pytest.raises(ValueError, match="outside the cache"):
        kernel.attention(q, kc, vc, torch.tensor([[3, 8]], dtype=torch.int32), qstart, lens, 0.1)


def _cpu_has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_amx_runs_where_the_cpu_has_it():
    kernel = cpu_attention.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    if os.environ.get(cpu_attention.AMX_SWITCH) != "0":
        assert kernel.uses_amx == _cpu_has_amx()


@pytest.mark.skipif(not _cpu_has_amx(), reason="no AMX: the suite already runs the AVX-512 loops")
def test_the_avx512_loops_on_a_cpu_with_amx():
    """Where AMX runs the bf16 rows, the AVX-512 loops (what AMD Zen 4 runs) would go untested:
    the invariance and reference tests of the kernel again, in a process with AMX turned off."""
    here = Path(__file__).parent
    env = {**os.environ, cpu_attention.AMX_SWITCH: "0"}
    probe = "from pagoda.runtime.cpu import attention; print(attention.load().uses_amx)"
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe], env=env, capture_output=True, text=True
    )
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    attention = here.parent / "attention"  # the kernel's invariance and reference tests
    tests = [str(attention / "test_row_invariance.py"), str(attention / "test_torch_backend.py")]
    # their kernel-path cases only (their `path` fixture's "kernel"): the torch path has no AMX
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "-k", "kernel", *tests]  # fmt: skip
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:]


@pytest.mark.parametrize(("window", "chunk", "alibi"),
                         [(None, None, False), (45, None, False), (None, 40, False),
                          (None, None, True)])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "h,hkv,d,bs", [(4, 2, 128, 64), (6, 3, 64, 48), (2, 1, 96, 32), (4, 4, 16, 16)]
)
def test_unusual_shapes_match_a_float64_reference(
    kernel, dtype, h, hkv, d, bs, window, chunk, alibi
):
    """Head dims and block sizes off the common path (AMX steps of 32 dims and 16 key pairs,
    tiles of several chunks per block): decodes and prefill chunks on cached context, with and
    without a sliding window (each query sees its last `window` keys) or chunked attention
    (Llama 4's: the query at p sees the keys p - p % chunk .. p), or ALiBi (BLOOM's slopes,
    each head's scores plus slope * (key - query))."""
    from pagoda.runtime.model.alibi import bloom_slopes

    g = torch.Generator().manual_seed(0)
    slopes = bloom_slopes(h) if alibi else None
    seqs = [(300, 1), (97, 1), (260, 70), (40, 40)]  # (context incl. new tokens, new tokens)
    p = 4 // dtype.itemsize
    nb = sum(-(-c // bs) for c, _ in seqs) + 3
    kc, vc = (
        torch.zeros(hkv, nb, d // p, bs, p, dtype=dtype),
        torch.zeros(hkv, nb, bs // p, d, p, dtype=dtype),
    )
    tables, slots = scattered_tables([c for c, _ in seqs], bs, nb, g)
    qs, refs = [], []
    for (c, m), seq_slots in zip(seqs, slots):
        k, v = (torch.randn(c, hkv, d, generator=g).to(dtype) for _ in range(2))
        q = torch.randn(m, h, d, generator=g).to(dtype)
        kernel.write_kv(k, v, kc, vc, seq_slots)
        kk, vv = (x.double().repeat_interleave(h // hkv, dim=1) for x in (k, v))
        s = torch.einsum("qhd,khd->hqk", q.double() * d**-0.5, kk)
        pos, keys = torch.arange(c - m, c)[:, None], torch.arange(c)[None, :]
        if slopes is not None:
            s = s + slopes.double()[:, None, None] * (keys - pos)
        s = s.masked_fill(keys > pos, float("-inf"))
        if window is not None:
            s = s.masked_fill(keys <= pos - window, float("-inf"))
        if chunk is not None:
            s = s.masked_fill(keys < pos - pos % chunk, float("-inf"))
        refs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv))
        qs.append(q)
    qstart = torch.tensor(
        [0, *torch.tensor([m for _, m in seqs]).cumsum(0).tolist()], dtype=torch.int32
    )
    lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    out = kernel.attention(torch.cat(qs), kc, vc, tables, qstart, lens, d**-0.5, window=window,
                           chunk=chunk, alibi=slopes)  # fmt: skip
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.double(), torch.cat(refs), atol=tol, rtol=tol)


@pytest.mark.parametrize(("window", "chunk", "alibi"),
                         [(None, None, False), (50, None, False), (None, 48, False),
                          (50, None, True)])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (16, 1, 64), (4, 4, 32)])
def test_a_row_is_the_same_at_every_place_in_a_tile(kernel, dtype, h, hkv, d, window, chunk, alibi):
    """One query row in chunks of 1 to 20 rows, at every offset: its row-heads sit at every
    place of a tile (AMX: 16 rows per tile; AVX-512: up to 12; AVX2: 6) and beside 0 to 15
    others. With a window, the chunk's first row's window starts one block earlier or not;
    with an attention chunk (48: the row's starts at 192), its first row's at 144 or 192."""
    from pagoda.runtime.model.alibi import mpt_slopes

    g, bs, n, pos = torch.Generator().manual_seed(1), 16, 240, 200
    slopes = mpt_slopes(h) if alibi else None
    p = 4 // dtype.itemsize
    nblk = -(-n // bs)
    kc = torch.zeros(hkv, nblk + 2, d // p, bs, p, dtype=dtype)
    vc = torch.zeros(hkv, nblk + 2, bs // p, d, p, dtype=dtype)
    table = torch.randperm(nblk + 2, generator=g)[:nblk].to(torch.int32)
    k, v = (torch.randn(n, hkv, d, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(n, h, d, generator=g).to(dtype)
    kernel.write_kv(k, v, kc, vc, table[torch.arange(n) // bs].long() * bs + torch.arange(n) % bs)

    def row(first: int, last: int) -> torch.Tensor:  # the step's rows: positions first..last
        qstart = torch.tensor([0, last - first + 1], dtype=torch.int32)
        lens = torch.tensor([last + 1], dtype=torch.int32)
        out = kernel.attention(
            q[first : last + 1], kc, vc, table[None], qstart, lens, d**-0.5, window=window,
            chunk=chunk, alibi=slopes,
        )  # fmt: skip
        return out[pos - first]

    want = row(pos, pos)  # a decode
    for size in range(2, 21):
        for first in range(pos - size + 1, pos + 1):
            assert torch.equal(row(first, first + size - 1), want), (size, first)
