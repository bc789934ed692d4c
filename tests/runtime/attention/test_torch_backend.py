"""The CPU attention backend against the per-sequence reference in pagoda.kernels.reference:
ragged decodes across several length buckets, prefill chunks on cached context, GQA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pagoda.kernels import reference
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.attention.torch_backend import TorchAttentionBackend, plan_buckets
from pagoda.runtime.cpu import attention as cpu_attention


def make_step(
    seq_lens, query_lens, h=6, hkv=2, d=32, bs=16, num_blocks=1000, dtype=torch.float32, seed=0
):
    g = torch.Generator().manual_seed(seed)
    nd = sum(1 for q in query_lens if q == 1)
    assert query_lens[:nd] == [1] * nd  # decodes first
    max_blocks = max((s + bs - 1) // bs for s in seq_lens)
    perm = torch.randperm(num_blocks, generator=g)[: len(seq_lens) * max_blocks]
    tables = perm.view(len(seq_lens), max_blocks).to(torch.int32)
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    T = sum(query_lens)
    q = torch.randn(T, h, d, generator=g).to(dtype)
    k = torch.randn(T, hkv, d, generator=g).to(dtype)
    v = torch.randn(T, hkv, d, generator=g).to(dtype)
    slots = []
    for i, (s, n) in enumerate(zip(seq_lens, query_lens)):
        for p in range(s - n, s):
            slots.append(int(tables[i, p // bs]) * bs + p % bs)
    cu = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens),
        num_decodes=nd,
        num_tokens=T,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=torch.from_numpy(cu),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=bs,
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
    )
    return q, k, v, k_cache, v_cache, meta


@pytest.fixture(params=["kernel", "torch"], autouse=True)
def path(request, monkeypatch) -> str:
    """Every test runs on both CPU paths: the C++ kernel and the torch gather path."""
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, request.param)
    if request.param == "kernel" and cpu_attention.load() is None:
        pytest.fail("the CPU attention kernel did not build on this machine (is g++ installed?)")
    return request.param


def to_backend_layout(
    be: TorchAttentionBackend, kc: torch.Tensor, vc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, block_size, Hkv, D] caches copied into the backend's own layout."""
    nb, bs, hkv, d = kc.shape
    mine = be.allocate_kv_cache(nb, bs, kc.dtype, kc.device)
    slots = torch.arange(nb * bs)
    be.write_kv(kc.view(-1, hkv, d), vc.view(-1, hkv, d), *mine, slots)
    return mine


def test_cache_layout_is_head_major_in_the_model_dtype(path):
    be = TorchAttentionBackend(6, 2, 32, 32**-0.5)
    k, v = be.allocate_kv_cache(10, 16, torch.bfloat16, torch.device("cpu"))
    assert k.dtype == v.dtype == torch.bfloat16
    if path == "torch":
        assert k.shape == v.shape == (2, 10, 16, 32)
    else:  # bf16 pairs: keys are the lanes of K words, dims the lanes of V words
        assert k.shape == (2, 10, 16, 16, 2) and v.shape == (2, 10, 8, 32, 2)


@pytest.mark.parametrize(
    "seq_lens,query_lens",
    [
        ([1], [1]),
        ([16, 17, 15, 1, 300, 33, 1000, 2, 64, 65], [1] * 10),  # ragged decodes, several buckets
        ([40], [40]),  # prefill from scratch
        ([100, 37], [20, 37]),  # chunk on cached context + fresh prompt
        ([5, 90, 200, 16], [1, 1, 50, 16]),  # mixed step
        ([1030], [1030]),  # > 1,000 tokens
        ([100, 50, 300, 64, 40], [20, 10, 64, 64, 40]),  # chunks on ragged contexts + fresh prompts
        ([3, 1, 70, 70, 40, 9], [1, 1, 1, 30, 40, 9]),  # 1-token prompt, several prefill buckets
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(seq_lens, query_lens, dtype):
    q, k, v, kc2, vc2, meta = make_step(seq_lens, query_lens, dtype=dtype)
    be = TorchAttentionBackend(6, 2, 32, 32**-0.5)
    kc, vc = to_backend_layout(be, kc2, vc2)
    be.prepare(meta)
    out = be.forward(q, k, v, kc, vc, meta)
    reference.write_kv_cache(k=k, v=v, k_cache=kc2, v_cache=vc2, slot_mapping=meta.slot_mapping)
    ref = reference.paged_attention(
        q=q,
        k_cache=kc2,
        v_cache=vc2,
        block_tables=meta.block_tables,
        seq_lens=meta.seq_lens,
        query_start_loc=meta.query_start_loc,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        scale=32**-0.5,
        num_decodes=meta.num_decodes,
    )
    kc_want, vc_want = to_backend_layout(be, kc2, vc2)
    assert torch.equal(kc, kc_want) and torch.equal(vc, vc_want)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_latent_cache_is_one_tensor_read_as_keys_and_values(dtype):
    """Multi-head latent attention's cache (``latent``): one KV head whose 48-wide rows are the
    keys and, in their first 32 columns, the values; one tensor (the torch path reads it on
    either setting), an output 32 wide; against the reference given the cache as K and V."""
    seq_lens, query_lens = [5, 90, 200, 16, 100, 37], [1, 1, 50, 16, 20, 37]
    q, k, _, kc2, _, meta = make_step(seq_lens, query_lens, h=6, hkv=1, d=48, dtype=dtype)
    be = TorchAttentionBackend(6, 1, 48, 0.1, latent=32)
    kc, vc = to_backend_layout(be, kc2, kc2)
    assert kc is vc and be.kernel is None and be.bytes_per_token(dtype) == 48 * dtype.itemsize
    be.prepare(meta)
    out = be.forward(q, k, k, kc, vc, meta)
    reference.write_kv_cache(k=k, v=k, k_cache=kc2, v_cache=kc2, slot_mapping=meta.slot_mapping)
    ref = reference.paged_attention(
        q=q, k_cache=kc2, v_cache=kc2, block_tables=meta.block_tables, seq_lens=meta.seq_lens,
        query_start_loc=meta.query_start_loc, max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len, scale=0.1, num_decodes=meta.num_decodes,
    )  # fmt: skip
    assert out.shape == (q.shape[0], 6, 32)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref[..., :32].float(), atol=tol, rtol=tol)


def test_bucket_plan_reduces_padding():
    lens = np.array([16] * 20 + [512] * 4 + [1024] * 2)
    ends = plan_buckets(lens)
    assert ends[-1] == len(lens) and len(ends) == 3
    padded = sum((e - s) * lens[e - 1] for s, e in zip([0, *ends[:-1]], ends))
    assert padded < 0.3 * len(lens) * lens[-1]
    assert plan_buckets(np.array([64] * 8)) == [8]  # equal lengths: one call


@pytest.mark.parametrize(
    "seq_lens,query_lens",
    [
        ([16, 17, 300, 1000, 2], [1] * 5),  # decodes, windows shorter and longer than contexts
        ([100, 37, 600], [20, 37, 300]),  # chunks on cached context, a fresh prompt
        ([5, 290, 200, 16], [1, 1, 50, 16]),  # mixed step
    ],
)
@pytest.mark.parametrize("window", [1, 17, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_sliding_window_and_softcap_match_reference(path, seq_lens, query_lens, window, dtype,
                                                    softcap):  # fmt: skip
    """A window layer's rows, with and without a soft cap, against the reference; the same
    backend still attends to the whole context in layers without a window. The kernel takes
    windows; a soft cap sends the model to the torch path."""
    q, k, v, kc2, vc2, meta = make_step(seq_lens, query_lens, dtype=dtype)
    be = TorchAttentionBackend(6, 2, 32, 32**-0.5, sliding_window=window, softcap=softcap)
    kc, vc = to_backend_layout(be, kc2, vc2)
    assert (be.kernel is not None) == (path == "kernel" and softcap is None)
    be.prepare(meta)
    windowed = be.forward(q, k, v, kc, vc, meta, window=window)
    full = be.forward(q, k, v, kc, vc, meta)
    reference.write_kv_cache(k=k, v=v, k_cache=kc2, v_cache=vc2, slot_mapping=meta.slot_mapping)
    args = dict(
        q=q, k_cache=kc2, v_cache=vc2, block_tables=meta.block_tables, seq_lens=meta.seq_lens,
        query_start_loc=meta.query_start_loc, max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len, scale=32**-0.5, softcap=softcap,
    )  # fmt: skip
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    want = reference.paged_attention(**args, sliding_window=window)
    torch.testing.assert_close(windowed.float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(
        full.float(), reference.paged_attention(**args).float(), atol=tol, rtol=tol
    )


@pytest.mark.parametrize(
    "seq_lens,query_lens",
    [([16, 17, 300, 1000, 2], [1] * 5), ([100, 37, 600, 290, 16], [20, 37, 300, 50, 16])],
)
@pytest.mark.parametrize("chunk", [7, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_chunks_match_reference(path, seq_lens, query_lens, chunk, dtype):
    """A chunked layer's rows (Llama 4: the query at p sees the keys p - p % chunk .. p),
    decodes and chunks on cached context crossing chunk starts, on both CPU paths, against
    the reference; the same backend attends to the whole context in the other layers."""
    q, k, v, kc2, vc2, meta = make_step(seq_lens, query_lens, dtype=dtype)
    be = TorchAttentionBackend(6, 2, 32, 32**-0.5)
    kc, vc = to_backend_layout(be, kc2, vc2)
    assert (be.kernel is not None) == (path == "kernel")
    be.prepare(meta)
    chunked = be.forward(q, k, v, kc, vc, meta, chunk=chunk)
    full = be.forward(q, k, v, kc, vc, meta)
    reference.write_kv_cache(k=k, v=v, k_cache=kc2, v_cache=vc2, slot_mapping=meta.slot_mapping)
    args = dict(
        q=q, k_cache=kc2, v_cache=vc2, block_tables=meta.block_tables, seq_lens=meta.seq_lens,
        query_start_loc=meta.query_start_loc, max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len, scale=32**-0.5,
    )  # fmt: skip
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    want = reference.paged_attention(**args, attention_chunk=chunk)
    torch.testing.assert_close(chunked.float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(
        full.float(), reference.paged_attention(**args).float(), atol=tol, rtol=tol
    )
