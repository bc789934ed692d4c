"""The int8 KV cache (``--kv-cache-dtype int8``): storage, the kernel's int8 loops, both CPU paths,
the engine end to end (accuracy against float32, capacity) and the configuration errors."""

from __future__ import annotations

import pytest
import torch
from attention_testlib import scattered_tables, step_meta
from pagoda.runtime import LLM, options
from pagoda.runtime.attention import get_attention_backend
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.attention.torch_backend import (
    TorchAttentionBackend,
    dequantize_rows,
    quantize_rows,
)
from pagoda.runtime.config import CacheConfig, EngineConfig
from pagoda.runtime.cpu import attention as cpu_attention
from pagoda.runtime.cpu import build as builder
from pagoda.runtime.server import cli


def _kernel() -> cpu_attention.CpuKernel:
    kernel = cpu_attention.load()
    assert kernel is not None, "the CPU attention kernel did not build (is g++ installed?)"
    return kernel


def _avx2_kernel() -> cpu_attention.CpuKernel:
    """Built for AVX2 + FMA without AVX-512: the loops of csrc/attention/q8_avx2.h, which AVX-512
    machines never build natively (the build is shared with test_cpu_attention's)."""
    if not {"avx2", "fma"} <= set(builder.cpu_signature().split()):
        pytest.skip("this CPU cannot run AVX2 + FMA code")
    flags = ["-march=haswell" if f == "-march=native" else f for f in cpu_attention.FLAGS]
    path = builder.build(
        cpu_attention.SOURCE, name="paged_attention_avx2", compiler="g++", flags=flags
    )
    return cpu_attention.CpuKernel(path)


KERNELS = {"native": _kernel, "avx2": _avx2_kernel}


def _unpack(kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernel's packed int8 blocks → ``[T, Hkv, D + 4]`` rows as `quantize_rows` writes them
    (the layout of ``csrc/attention/q8.h``, read back token by token)."""
    hkv, nb, bs, width = kc.shape
    d, ks, vs = width - 4, [], []
    for slot in slots.tolist():
        b, o = divmod(slot, bs)
        kb, vb = kc.view(hkv, nb, bs * width)[:, b], vc.view(hkv, nb, bs * width)[:, b]
        k_vals = kb[:, : bs * d].view(hkv, d // 4, bs, 4)[:, :, o].reshape(hkv, d)
        v_vals = vb[:, : bs * d].view(hkv, bs // 4, d, 4)[:, o // 4, :, o % 4]
        ks.append(torch.cat([k_vals, kb[:, bs * d :].view(hkv, bs, 4)[:, o]], dim=-1))
        vs.append(torch.cat([v_vals, vb[:, bs * d :].view(hkv, bs, 4)[:, o]], dim=-1))
    return torch.stack(ks), torch.stack(vs)


def test_quantized_rows_round_trip_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=g) * torch.logspace(-3, 2, 64)
    x[7, 1] = 0.0  # an all-zero row: scale 0, values 0
    rows = quantize_rows(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, 68)
    back = dequantize_rows(rows, torch.float32)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((back - x).abs() <= step / 2 * (1 + 1e-6) + 1e-30).all()
    assert torch.equal(back[7, 1], torch.zeros(64)) and rows[..., :64].abs().max() == 127


def test_the_kernel_stores_what_quantize_rows_computes():
    """Same int8 values and scales in the kernel's packed layout as the torch path's rows."""
    kernel, g = _kernel(), torch.Generator().manual_seed(1)
    be = TorchAttentionBackend(6, 3, 64, 0.125, "int8")
    kc, vc = be.allocate_kv_cache(10, 16, torch.bfloat16, torch.device("cpu"))
    slots = torch.randperm(160, generator=g)[:90]
    k, v = (torch.randn(90, 3, 64, generator=g).to(torch.bfloat16) * 5 for _ in range(2))
    kernel.write_kv(k, v, kc, vc, slots)
    got_k, got_v = _unpack(kc, vc, slots)
    assert torch.equal(got_k, quantize_rows(k)) and torch.equal(got_v, quantize_rows(v))


def _reference(q, k, v, c, m, h, hkv, d, window=None):
    """float64 attention of m query rows at the end of a c-token context over dequantized K/V
    (each row over its last `window` keys when given)."""
    kk, vv = (dequantize_rows(quantize_rows(x), torch.float64) for x in (k, v))
    kk, vv = (x.repeat_interleave(h // hkv, dim=1) for x in (kk, vv))
    s = torch.einsum("qhd,khd->hqk", q.double() * d**-0.5, kk)
    pos, keys = torch.arange(c - m, c)[:, None], torch.arange(c)[None, :]
    s = s.masked_fill(keys > pos, float("-inf"))
    if window is not None:
        s = s.masked_fill(keys <= pos - window, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("h,hkv,d,bs", [(9, 3, 64, 16), (4, 2, 128, 64), (6, 3, 96, 48)])
def test_int8_attention_matches_a_float64_reference(h, hkv, d, bs, window):
    """Decodes and prefill chunks on cached context, with and without a sliding window. The
    kernel also rounds q (two int8 planes, ~15 bits) and p (8 bits per 16 keys): a tolerance
    of a few thousandths of outputs of ~0.5."""
    kernel, g = _kernel(), torch.Generator().manual_seed(0)
    seqs = [(300, 1), (97, 1), (260, 70), (40, 40), (1200, 1)]
    nb = sum(-(-c // bs) for c, _ in seqs) + 3
    be = TorchAttentionBackend(h, hkv, d, d**-0.5, "int8")
    kc, vc = be.allocate_kv_cache(nb, bs, torch.float32, torch.device("cpu"))
    tables, slots = scattered_tables([c for c, _ in seqs], bs, nb, g)
    qs, refs = [], []
    for (c, m), seq_slots in zip(seqs, slots):
        k = torch.randn(c, hkv, d, generator=g) * torch.linspace(0.3, 3, d)  # uneven channels
        v = torch.randn(c, hkv, d, generator=g)
        q = torch.randn(m, h, d, generator=g)
        kernel.write_kv(k, v, kc, vc, seq_slots)
        refs.append(_reference(q, k, v, c, m, h, hkv, d, window))
        qs.append(q)
    qstart = torch.tensor([0, *torch.tensor([m for _, m in seqs]).cumsum(0).tolist()]).int()
    lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    out = kernel.attention(torch.cat(qs), kc, vc, tables, qstart, lens, d**-0.5, window=window)
    want = torch.cat(refs)
    assert out.dtype == torch.float32
    err = (out.double() - want).abs()
    # measured: max 0.016, rms 0.0013 (q in one int8 plane instead of two: 0.034, 0.0031)
    assert err.max() < 0.03 and err.pow(2).mean().sqrt() < 0.0025, (err.max(), err.pow(2).mean())


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("build", KERNELS)
@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (16, 1, 64)])
def test_an_int8_row_is_the_same_at_every_place_in_a_tile(h, hkv, d, build, window):
    """One query row in chunks of 1 to 14 rows at every offset: the same bits as a decode
    (with a window, chunks whose first row's window starts blocks earlier)."""
    kernel, g, bs, n, pos = KERNELS[build](), torch.Generator().manual_seed(1), 16, 240, 200
    be = TorchAttentionBackend(h, hkv, d, d**-0.5, "int8")
    kc, vc = be.allocate_kv_cache(-(-n // bs) + 2, bs, torch.bfloat16, torch.device("cpu"))
    table = torch.randperm(kc.shape[1], generator=g)[: -(-n // bs)].to(torch.int32)
    k, v = (torch.randn(n, hkv, d, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(n, h, d, generator=g).to(torch.bfloat16)
    kernel.write_kv(k, v, kc, vc, table[torch.arange(n) // bs].long() * bs + torch.arange(n) % bs)

    def row(first: int, last: int) -> torch.Tensor:
        qstart = torch.tensor([0, last - first + 1], dtype=torch.int32)
        lens = torch.tensor([last + 1], dtype=torch.int32)
        out = kernel.attention(
            q[first : last + 1], kc, vc, table[None], qstart, lens, d**-0.5, window=window
        )
        return out[pos - first]

    want = row(pos, pos)
    for size in range(2, 15):
        for first in range(pos - size + 1, pos + 1):
            assert torch.equal(row(first, first + size - 1), want), (size, first)


@pytest.mark.parametrize("build", ["x86-64-v2", "avx2"])
@pytest.mark.slow
def test_a_build_without_avx512_gives_the_same_cache_and_output(tmp_path, build):
    """The plain-vector fallbacks of the int8 loops (x86-64-v2: no AVX2) and the AVX2 loops:
    exact integer sums, so the same bytes in the cache and the same outputs to float rounding
    (the softmax's multiply-adds are fused or not)."""
    if build == "avx2":
        other = _avx2_kernel()
    else:
        flags = ["-march=x86-64-v2" if f == "-march=native" else f for f in cpu_attention.FLAGS]
        path = builder.build(
            cpu_attention.SOURCE, name="attention_portable", compiler="g++", flags=flags,
            directory=tmp_path,
        )  # fmt: skip
        other = cpu_attention.CpuKernel(path)
    g, c = torch.Generator().manual_seed(2), 700
    k, v = (torch.randn(c, 3, 64, generator=g) for _ in range(2))
    q = torch.randn(5, 9, 64, generator=g)
    be, results = TorchAttentionBackend(9, 3, 64, 0.125, "int8"), []
    for kernel in (_kernel(), other):
        kc, vc = be.allocate_kv_cache(c // 16 + 1, 16, torch.float32, torch.device("cpu"))
        kernel.write_kv(k, v, kc, vc, torch.arange(c))
        table = torch.arange(kc.shape[1], dtype=torch.int32)[None]
        qstart, lens = torch.tensor([0, 5]).int(), torch.tensor([c]).int()
        results.append((kc, vc, kernel.attention(q, kc, vc, table, qstart, lens, 0.125)))
    (k0, v0, o0), (k1, v1, o1) = results
    assert torch.equal(k0, k1) and torch.equal(v0, v1)
    torch.testing.assert_close(o0, o1, atol=1e-5, rtol=1e-5)


def test_the_torch_path_reads_an_int8_cache_like_the_kernel(monkeypatch):
    """Without the kernel the torch path stores the same values in rows of D + 4 bytes and
    attends over them dequantized (no rounding of q or p): close to the kernel's result."""
    g, bs = torch.Generator().manual_seed(3), 16
    seqs = [(130, 1, [4, 0, 7, 2, 9, 1, 3, 5, 6]), (50, 20, [8, 10, 11, 12])]
    slots = [t[p // bs] * bs + p % bs for s, n, t in seqs for p in range(s - n, s)]
    cached = [t[p // bs] * bs + p % bs for s, n, t in seqs for p in range(s - n)]
    q = torch.randn(21, 6, 32, generator=g)
    k, v, kx, vx = (torch.randn(n, 2, 32, generator=g) for n in (21, 21, len(cached), len(cached)))
    outs = []
    for path in ("kernel", "torch"):
        monkeypatch.setenv(cpu_attention.ENV_SWITCH, path)
        be = TorchAttentionBackend(6, 2, 32, 32**-0.5, "int8")
        kc, vc = be.allocate_kv_cache(16, bs, torch.float32, torch.device("cpu"))
        assert (be.kernel is None) == (path == "torch") and kc.shape == (2, 16, bs, 36)
        be.write_kv(kx, vx, kc, vc, torch.tensor(cached))
        meta: AttentionMetadata = step_meta(seqs, slots, bs)
        be.prepare(meta)
        outs.append(be.forward(q, k, v, kc, vc, meta))
    err = (outs[0] - outs[1]).abs()
    assert err.max() < 0.05 and err.pow(2).mean().sqrt() < 0.01


def _teacher_forced_logits(smol, ids: list[int], **engine) -> torch.Tensor:
    """Logits of every position of `ids`, prefilled as one chunk (each row reads the cache)."""
    llm = LLM(loaded=smol, max_model_len=1024, kv_cache_memory=32 << 20, **engine)
    r, n = llm.engine.runner, len(ids)
    blocks = list(range(-(-n // r.block_size)))
    meta = step_meta([(n, n, blocks)], list(range(n)), r.block_size)
    r.backend.prepare(meta)
    ids_t, pos = torch.tensor(ids), torch.arange(n)
    return r.model.forward(ids_t, pos, r.kv_caches, meta, pos).float()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_the_embedded_model_with_an_int8_cache_stays_close_to_float32(
    smol, corpus_ids, path, monkeypatch
):
    """Next-token distributions over 400 positions of real text: the int8 cache moves them about
    as far from a float32 model as bf16 does (measured: mean KL 0.003 vs 0.001)."""
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, path)
    ids = corpus_ids[:400]
    ref = torch.log_softmax(_teacher_forced_logits(smol, ids, dtype="float32"), -1)
    got = torch.log_softmax(_teacher_forced_logits(smol, ids, kv_cache_dtype="int8"), -1)
    kl = (ref.exp() * (ref - got)).sum(-1)
    top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean()
    assert kl.mean() < 0.01 and top1 > 0.93, (kl.mean(), top1)


def test_an_int8_cache_holds_about_twice_the_tokens(smol):
    """Same byte budget: D + 4 bytes per token and head instead of 2 D (bf16): 128 / 68."""
    counts = {}
    for kv in ("auto", "int8"):
        llm = LLM(loaded=smol, dtype="bfloat16", kv_cache_memory=64 << 20, kv_cache_dtype=kv)
        counts[kv] = llm.engine.runner.num_blocks
        del llm
    assert counts["int8"] == pytest.approx(counts["auto"] * 128 / 68, rel=0.01)


def test_bad_or_unsupported_choices_are_clear_errors():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, int8, fp8"):
        CacheConfig(kv_cache_dtype="fp4")
    with pytest.raises(ValueError, match="Triton attention backend only"):
        get_attention_backend("torch", torch.device("cpu"), 4, 2, 64, 0.1, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="CPU attention backend only"):
        EngineConfig.create(device="cuda", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="CPU attention backend only"):
        EngineConfig.create(attention_backend="triton", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="is a CPU feature"):
        get_attention_backend("auto", torch.device("cuda"), 4, 2, 64, 0.1, kv_cache_dtype="int8")


def test_the_serve_flag_reaches_the_engine_config():
    args = cli.build_parser().parse_args(["--kv-cache-dtype", "int8"])
    engine_kwargs = options.engine_kwargs(vars(args))
    assert EngineConfig.create(**engine_kwargs).cache.kv_cache_dtype == "int8"
    assert cli.build_parser().parse_args([]).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--kv-cache-dtype", "fp4"])


def test_packed_shapes_and_geometry_agree_for_int8():
    """The Python side of the layout the C++ reads: a block's size and the head dim."""
    ks, vs = cpu_attention.packed_shapes(3, 10, 32, 64, torch.int8)
    assert ks == vs == (3, 10, 32, 68)
    kc, vc = torch.zeros(ks, dtype=torch.int8), torch.zeros(vs, dtype=torch.int8)
    assert cpu_attention.geometry(kc, vc) == (cpu_attention.INT8, 3, 10, 32, 64)
