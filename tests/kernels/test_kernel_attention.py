"""paged_attention (unified and split-KV paths) against the torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL, make_batch, mixed_seqs
from pagoda.kernels import reference

# (dtype, head_dim, queries per KV head, block_size): every value of each axis appears,
# including non-power-of-two head sizes (80, 96) and GQA ratios (3).
CASES = [
    (torch.float32, 64, 1, 16),
    (torch.float16, 80, 3, 32),
    (torch.bfloat16, 96, 4, 16),
    (torch.float16, 128, 2, 32),
    (torch.bfloat16, 64, 8, 16),
]
# How the batch is handled: split-KV decodes (one segment, or 4) and the prefill kernel for the
# other sequences; every row in the prefill kernel (batch-invariant); the unified kernel for the
# whole mixed batch in one launch. (The launcher's own rule picks splits only for long
# contexts: see test_long_context.)
PATHS = {
    "flash": {"num_decodes": None},
    "split4": {"num_kv_splits": 4},
    "invariant": {"batch_invariant": True},
    "unified": {"num_decodes": None, "flash_prefill": False},
}


def _ids(case: tuple) -> str:
    dtype, d, g, bs = case
    return f"{str(dtype).removeprefix('torch.')}-d{d}-gqa{g}-bs{bs}"


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_mixed_batch_matches_reference(device, case, path):
    from pagoda.kernels import paged_attention

    dtype, head_dim, group, block_size = case
    kv_heads = 2
    batch = make_batch(
        mixed_seqs(block_size),
        num_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
    )
    args = batch.attention_args(scale=head_dim**-0.5)
    kwargs = {"num_decodes": batch.num_decodes, **PATHS[path]}
    expected = reference.paged_attention(**args)
    got = paged_attention(**args, **kwargs)
    torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("splits", [1, 2, 8])
def test_decode_only_batch(device, splits):
    """All sequences decode; segments may be empty (seq_len 1 with 8 splits)."""
    from pagoda.kernels import paged_attention

    seqs = [(1, n) for n in (1, 16, 17, 40, 95, 200)]
    batch = make_batch(
        seqs,
        num_heads=6,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        device=device,
    )
    args = batch.attention_args(scale=0.125)
    expected = reference.paged_attention(**args)
    got = paged_attention(**args, num_kv_splits=splits)  # num_decodes inferred from max_query_len
    torch.testing.assert_close(got, expected, **TOL[torch.float16])


@pytest.mark.parametrize("splits", [None, 1, 8], ids=["rule", "split1", "split8"])
def test_long_context(device, splits):
    """> 1,000 tokens: a long decode (split and unsplit), a chunk deep into a long context, and a
    1,030-token prefill from scratch; one KV head keeps the interpreter quick. ``None``: the
    rule picks 4 splits here (1,300 tokens, 4 "SMs"). The decodes' launch is the only one the
    split count changes (the prefill kernel takes the other rows alike), so a forced count runs
    the long decode alone."""
    from pagoda.kernels import paged_attention

    seqs = [(1, 1300), (24, 1100), (1030, 1030)] if splits is None else [(1, 1300)]
    batch = make_batch(
        seqs,
        num_heads=1,
        num_kv_heads=1,
        head_dim=64,
        block_size=32,
        dtype=torch.float16,
        device=device,
    )
    args = batch.attention_args(scale=0.125)
    expected = reference.paged_attention(**args)
    got = paged_attention(**args, num_decodes=1, num_kv_splits=splits)
    torch.testing.assert_close(got, expected, **TOL[torch.float16])


def test_block_ids_near_end_of_large_pool(device):
    """Element offsets past 2**31: the pool is 1.1M blocks of 32×64 fp16 (4.5 GB each for K and
    V, allocated lazily; only the used blocks at the very end are touched)."""
    from pagoda.kernels import paged_attention, write_kv_cache

    num_blocks = 1_100_000
    if device.type == "cuda" and torch.cuda.mem_get_info()[0] < 12 * 2**30:
        pytest.skip("needs ~10 GB of free GPU memory")
    batch = make_batch(
        [(1, 70), (1, 33), (5, 40)],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=32,
        dtype=torch.float16,
        device=device,
        num_blocks=num_blocks,
        blocks_at_end=True,
        fill_new=False,
    )
    assert batch.k_cache.stride(0) * (num_blocks - 1) > 2**31
    write_kv_cache(
        k=batch.k_new,
        v=batch.v_new,
        k_cache=batch.k_cache,
        v_cache=batch.v_cache,
        slot_mapping=batch.slot_mapping,
    )
    flat_k = batch.k_cache.view(-1, 1, 64)
    torch.testing.assert_close(flat_k[batch.slot_mapping], batch.k_new, rtol=0, atol=0)
    args = batch.attention_args(scale=0.125)
    expected = reference.paged_attention(**args)
    for splits in (None, 2):
        got = paged_attention(**args, num_decodes=2, num_kv_splits=splits)
        torch.testing.assert_close(got, expected, **TOL[torch.float16])


@pytest.mark.parametrize("splits", [1, 4])
def test_padding_rows_are_zero_and_out_is_reused(device, splits):
    """CUDA-graph padding: sequences of length 0 give zeros (not NaN); ``out`` is filled in place."""
    from pagoda.kernels import paged_attention

    batch = make_batch(
        [(1, 9), (1, 1), (1, 1)],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        device=device,
    )
    batch.seq_lens[1:] = 0
    out = torch.full_like(batch.q, float("nan"))
    args = batch.attention_args(scale=0.125)
    got = paged_attention(**args, out=out, num_kv_splits=splits)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    torch.testing.assert_close(out[:1], reference.paged_attention(**args)[:1], **TOL[torch.float16])


def test_rejects_bad_inputs(device):
    from pagoda.kernels import paged_attention

    batch = make_batch(
        [(1, 4)],
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        dtype=torch.float16,
        device=device,
    )
    args = batch.attention_args(scale=0.125)
    with pytest.raises(ValueError, match="int32"):
        paged_attention(**{**args, "seq_lens": batch.seq_lens.long()})
    with pytest.raises(ValueError, match="power of two"):
        paged_attention(**args, num_kv_splits=3)
    with pytest.raises(ValueError, match="dtypes differ"):
        paged_attention(**{**args, "q": batch.q.float()}, out=None)


def _poison_outside_windows(batch, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the caches with NaN in every key and value slot no query of its sequence sees
    (the positions before the first query's window): a kernel that reads one of them, even
    to mask it, returns NaN."""
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    bs = k_cache.shape[1]
    for seq, (q_len, s_len) in enumerate(zip(batch.query_lens, batch.seq_lens_host)):
        for pos in range(max(0, s_len - q_len - window + 1)):
            blk = int(batch.block_tables[seq, pos // bs])
            k_cache[blk, pos % bs] = float("nan")
            v_cache[blk, pos % bs] = float("nan")
    return k_cache, v_cache


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    ("dtype", "head_dim", "window"),
    [
        (torch.float32, 64, 1),
        (torch.bfloat16, 128, 5),
        (torch.float16, 64, 16),
        (torch.float32, 128, 37),
    ],
    ids=["f32-d64-w1", "bf16-d128-w5", "f16-d64-w16", "f32-d128-w37"],
)
def test_sliding_window_reads_only_the_window(device, dtype, head_dim, window, path):
    """Windows shorter than some contexts, at and off block edges: the kernels match the
    reference and never touch a key outside the window (those are NaN here)."""
    from pagoda.kernels import paged_attention

    block_size = 16
    batch = make_batch(
        [*mixed_seqs(block_size), (1, 70), (20, 60)],
        num_heads=4, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
        dtype=dtype, device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=head_dim**-0.5)
    expected = reference.paged_attention(**args, sliding_window=window)
    k_cache, v_cache = _poison_outside_windows(batch, window)
    got = paged_attention(
        **{**args, "k_cache": k_cache, "v_cache": v_cache},
        **{"num_decodes": batch.num_decodes, **PATHS[path]}, sliding_window=window,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, **TOL[dtype])
    # the window matters: attending to the whole context gives other rows
    full = reference.paged_attention(**args)
    assert not torch.allclose(full[-1].float(), expected[-1].float(), **TOL[dtype])


def _poison_before_chunks(batch, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of the caches with NaN in every key and value slot before the chunk of its
    sequence's first query: a kernel that reads one of them, even to mask it, returns NaN."""
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    bs = k_cache.shape[1]
    for seq, (q_len, s_len) in enumerate(zip(batch.query_lens, batch.seq_lens_host)):
        first = s_len - q_len
        for pos in range(first - first % chunk):
            blk = int(batch.block_tables[seq, pos // bs])
            k_cache[blk, pos % bs] = float("nan")
            v_cache[blk, pos % bs] = float("nan")
    return k_cache, v_cache


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    ("dtype", "head_dim", "group", "chunk"),
    [(torch.float32, 64, 1, 8), (torch.bfloat16, 128, 5, 16), (torch.float16, 64, 2, 37)],
    ids=["f32-d64-c8", "bf16-d128-gqa5-c16", "f16-d64-c37"],
)
def test_chunked_attention_reads_only_its_chunk(device, dtype, head_dim, group, chunk, path):
    """Llama 4's chunked attention (the query at p sees the keys p - p % C .. p): chunks
    shorter than a tile, at a block's size and off block edges, query tiles and prefill chunks
    crossing chunk boundaries; every path matches the reference (transformers' chunked mask)
    and never reads a key before its first query's chunk (those are NaN here)."""
    from pagoda.kernels import paged_attention

    block_size = 16
    batch = make_batch(
        [*mixed_seqs(block_size), (1, 70), (20, 60), (45, 90)],
        num_heads=2 * group, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
        dtype=dtype, device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=head_dim**-0.5)
    expected = reference.paged_attention(**args, attention_chunk=chunk)
    k_cache, v_cache = _poison_before_chunks(batch, chunk)
    got = paged_attention(
        **{**args, "k_cache": k_cache, "v_cache": v_cache},
        **{"num_decodes": batch.num_decodes, **PATHS[path]}, attention_chunk=chunk,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, **TOL[dtype])
    # the chunk matters: attending to the whole context gives other rows
    full = reference.paged_attention(**args)
    assert not torch.allclose(full[-1].float(), expected[-1].float(), **TOL[dtype])


@pytest.mark.parametrize("path", list(PATHS))
def test_softcap_matches_reference(device, path):
    from pagoda.kernels import paged_attention

    batch = make_batch(
        mixed_seqs(16), num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
        dtype=torch.float32, device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=0.5)  # large scores, so that the cap bites
    expected = reference.paged_attention(**args, softcap=3.0, sliding_window=20)
    kwargs = {"num_decodes": batch.num_decodes, **PATHS[path]}
    got = paged_attention(**args, **kwargs, softcap=3.0, sliding_window=20)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])
    assert not torch.allclose(expected, reference.paged_attention(**args, sliding_window=20))


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_match_reference(device, path, dtype):
    """Attention sinks (gpt-oss): each head's logit joins its denominator, in every path (the
    split-KV decodes add it in their merge), with a window and a soft cap beside it."""
    from pagoda.kernels import paged_attention

    batch = make_batch(
        mixed_seqs(16), num_heads=6, num_kv_heads=2, head_dim=64, block_size=16, dtype=dtype,
        device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=0.25)
    sinks = torch.tensor([4.0, -1.0, 0.5, 9.0, -30.0, 2.0], device=device)  # 9: most mass
    extra = dict(sliding_window=20, softcap=8.0) if dtype == torch.bfloat16 else {}
    expected = reference.paged_attention(**args, sinks=sinks, **extra)
    kwargs = {"num_decodes": batch.num_decodes, **PATHS[path]}
    got = paged_attention(**args, **kwargs, sinks=sinks, **extra)
    torch.testing.assert_close(got, expected, **TOL[dtype])
    assert not torch.allclose(expected.float(), reference.paged_attention(**args, **extra).float(),
                              **TOL[dtype])  # fmt: skip


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_matches_reference(device, path, dtype):
    """ALiBi (BLOOM, MPT): each head's scores plus slope * (key - query), in every path (the
    prefill kernel's full tiles too, the split-KV decodes' segments), BLOOM's slopes for six
    heads (not a power of two); with a window and a soft cap beside it in bf16."""
    from pagoda.kernels import paged_attention
    from pagoda.runtime.model.alibi import bloom_slopes

    batch = make_batch(
        mixed_seqs(16), num_heads=6, num_kv_heads=2, head_dim=64, block_size=16, dtype=dtype,
        device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=0.25)
    slopes = bloom_slopes(6).to(device)
    extra = dict(sliding_window=20, softcap=8.0) if dtype == torch.bfloat16 else {}
    expected = reference.paged_attention(**args, alibi_slopes=slopes, **extra)
    kwargs = {"num_decodes": batch.num_decodes, **PATHS[path]}
    got = paged_attention(**args, **kwargs, alibi_slopes=slopes, **extra)
    torch.testing.assert_close(got, expected, **TOL[dtype])
    assert not torch.allclose(expected.float(), reference.paged_attention(**args, **extra).float(),
                              **TOL[dtype])  # fmt: skip


# The new families' shapes on the compiled kernels (dtype, head_dim, heads, KV heads, sinks):
# DeepSeek's latent attention expanded per head at 192 (256 wide in the tiles) and the tiny
# checkpoints' 48, gpt-oss's 64 with sinks over 8 query heads per KV head, GLM-4-9B's 16 per KV
# head at 128.
NEW_FAMILY_CASES = [
    (torch.bfloat16, 192, 4, 4, False),
    (torch.float16, 192, 4, 4, False),
    (torch.float32, 48, 4, 4, False),
    (torch.bfloat16, 64, 16, 2, True),
    (torch.bfloat16, 128, 32, 2, False),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(
    "case", NEW_FAMILY_CASES,
    ids=lambda c: f"{str(c[0]).removeprefix('torch.')}-d{c[1]}-h{c[2]}-kv{c[3]}"
    + ("-sinks" if c[4] else ""),
)  # fmt: skip
def test_new_families_head_shapes_match_reference(device, case, path):
    """Compiled tiles at the head sizes and GQA ratios the new families reach (the interpreter
    covers the masked head tail at 80 and 96 above): every path against the reference."""
    from pagoda.kernels import paged_attention

    if device.type == "cpu":
        pytest.skip("compiled tiles only (gpu_check.sh's `families` step)")
    dtype, head_dim, heads, kv_heads, with_sinks = case
    batch = make_batch(mixed_seqs(16), num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=head_dim, block_size=16, dtype=dtype, device=device)  # fmt: skip
    args = batch.attention_args(scale=head_dim**-0.5)
    extra = {}
    if with_sinks:
        extra = dict(sinks=torch.linspace(-4.0, 6.0, heads, device=device), sliding_window=20)
    expected = reference.paged_attention(**args, **extra)
    kwargs = {"num_decodes": batch.num_decodes, **PATHS[path]}
    got = paged_attention(**args, **kwargs, **extra)
    torch.testing.assert_close(got, expected, **TOL[dtype])
