"""The FlashAttention-2-style prefill kernel (``prefill_attention.py``) against the torch reference,
its tile loop's edges (unmasked interior, causal diagonal, window start), and batch invariance
across its decode and prefill launch configs."""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL, make_batch, mixed_seqs
from pagoda.kernels import reference

# Launch configs of different shapes: a decode-like one, and prefill ones whose query tiles
# cover several keys tiles and whose key tiles span several cache blocks.
CONFIGS = {
    "m16-t16": {"BLOCK_M": 16, "TILE_SIZE": 16, "num_warps": 4, "num_stages": 2},
    "m64-t32": {"BLOCK_M": 64, "TILE_SIZE": 32, "num_warps": 4, "num_stages": 2},
    "m128-t64": {"BLOCK_M": 128, "TILE_SIZE": 64, "num_warps": 8, "num_stages": 3},
}
# Fresh prompts, chunks over cached context starting mid-block and on a block edge, a one-token
# chunk, and lengths either side of the tile sizes, all in one batch.
SEQS = [(37, 37), (5, 21), (16, 48), (1, 9), (70, 101), (64, 64), (3, 130)]


def _launch(
    batch, config, *, window=None, softcap=None, seqs=None, one_token=False, scale=None, chunk=None
):
    from pagoda.kernels.prefill_attention import launch_prefill_attention

    args = batch.attention_args(scale=scale or batch.q.shape[2] ** -0.5)
    out = torch.full_like(batch.q, float("nan"))
    first, last = seqs or (0, len(batch.query_lens))
    qsl = batch.query_start_loc.tolist()
    launch_prefill_attention(
        q=args["q"], k_cache=args["k_cache"], v_cache=args["v_cache"],
        block_tables=args["block_tables"], seq_lens=args["seq_lens"],
        query_start_loc=args["query_start_loc"], scale=args["scale"], out=out,
        first_seq=first, last_seq=last, first_token=qsl[first], last_token=qsl[last],
        config=config, one_token_per_seq=one_token, sliding_window=window, softcap=softcap,
        attention_chunk=chunk,
    )  # fmt: skip
    return out, args


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize(
    ("dtype", "group", "head_dim", "block_size"),
    [(torch.float32, 4, 32, 16), (torch.bfloat16, 3, 64, 16), (torch.float16, 1, 80, 32)],
    ids=["f32-gqa4-d32-bs16", "bf16-gqa3-d64-bs16", "f16-mha-d80-bs32"],
)
def test_matches_reference(device, config, dtype, group, head_dim, block_size):
    batch = make_batch(
        SEQS, num_heads=2 * group, num_kv_heads=2, head_dim=head_dim, block_size=block_size,
        dtype=dtype, device=device,
    )  # fmt: skip
    got, args = _launch(batch, CONFIGS[config])
    torch.testing.assert_close(got, reference.paged_attention(**args), **TOL[dtype])


def test_wide_heads_shrink_the_tiles(device, monkeypatch):
    """Head size 256 (Gemma) in bf16: the 128-row, 64-key config runs with 64 rows and 32 keys,
    so the query tile and the K/V stages keep their size; results match the reference."""
    from pagoda.kernels import prefill_attention

    seen = []
    kernel = prefill_attention._prefill_attention_kernel
    monkeypatch.setattr(
        prefill_attention,
        "_prefill_attention_kernel",
        type("Spy", (), {"__getitem__": lambda self, grid: _spy(kernel[grid], seen)})(),
    )
    batch = make_batch(
        [(40, 40), (9, 30)], num_heads=4, num_kv_heads=2, head_dim=256, block_size=16,
        dtype=torch.bfloat16, device=device,
    )  # fmt: skip
    got, args = _launch(batch, CONFIGS["m128-t64"])
    assert (seen[0]["BLOCK_M"], seen[0]["TILE_SIZE"]) == (64, 32)
    torch.testing.assert_close(got, reference.paged_attention(**args), **TOL[torch.bfloat16])


def _spy(launch, seen):
    def run(*args, **kwargs):
        seen.append(kwargs)
        return launch(*args, **kwargs)

    return run


@pytest.mark.parametrize(("window", "softcap"), [(1, None), (19, None), (40, 2.0), (None, 2.0)])
@pytest.mark.parametrize("config", ["m16-t16", "m128-t64"])
def test_window_and_softcap(device, config, window, softcap):
    """Windows shorter than a query tile, than a key tile and longer than both; the keys
    outside every window are NaN in the cache, so reading one would show."""
    batch = make_batch(
        SEQS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32,
        device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=0.5)  # large scores, so that the cap bites
    want = reference.paged_attention(**args, sliding_window=window, softcap=softcap)
    if window is not None:
        _poison_outside_windows(batch, window)
    got, _ = _launch(batch, CONFIGS[config], window=window, softcap=softcap, scale=0.5)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("chunk", [8, 40, 100])
@pytest.mark.parametrize("config", ["m16-t16", "m128-t64"])
def test_chunked_attention(device, config, chunk):
    """Chunked attention (Llama 4): chunks shorter than a key tile, between the tiles and
    longer than a 64-key tile (unmasked interior tiles inside one chunk), query tiles across
    chunk starts; the keys before each sequence's first chunk are NaN in the cache."""
    batch = make_batch(
        SEQS, num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32,
        device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=0.5)
    want = reference.paged_attention(**args, attention_chunk=chunk)
    bs = batch.k_cache.shape[1]
    for i, (q_len, s_len) in enumerate(zip(batch.query_lens, batch.seq_lens_host, strict=True)):
        for pos in range((s_len - q_len) // chunk * chunk):
            batch.k_cache[int(batch.block_tables[i, pos // bs]), pos % bs] = float("nan")
    got, _ = _launch(batch, CONFIGS[config], chunk=chunk, scale=0.5)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def _poison_outside_windows(batch, window: int) -> None:
    """NaN into every cached key/value no query of its sequence may see."""
    bs = batch.k_cache.shape[1]
    for i, (q_len, s_len) in enumerate(zip(batch.query_lens, batch.seq_lens_host, strict=True)):
        first_seen = max(0, s_len - q_len - window + 1)
        for pos in range(first_seen):
            blk = int(batch.block_tables[i, pos // bs])
            batch.k_cache[blk, pos % bs] = float("nan")
            batch.v_cache[blk, pos % bs] = float("nan")


def test_decode_launch_and_empty_sequences(device):
    """``one_token_per_seq`` (the batch-invariant decode launch) and length-0 sequences (CUDA-
    graph padding): zeros, not NaN; rows outside the launched sequences are left alone."""
    batch = make_batch(
        [(1, 1), (1, 17), (1, 40), (1, 3)], num_heads=4, num_kv_heads=2, head_dim=32,
        block_size=16, dtype=torch.float32, device=device,
    )  # fmt: skip
    batch.seq_lens[3] = 0
    got, args = _launch(batch, CONFIGS["m16-t16"], one_token=True, seqs=(0, 3))
    want = reference.paged_attention(**args)
    torch.testing.assert_close(got[:3], want[:3], **TOL[torch.float32])
    assert torch.isnan(got[3]).all()  # sequence 3 was not in the launch
    got, _ = _launch(batch, CONFIGS["m64-t32"], seqs=(3, 4))
    assert torch.equal(got[3], torch.zeros_like(got[3]))


def test_rejects_other_cache_dtypes(device):
    from pagoda.kernels.prefill_attention import check_kv_dtype

    q = torch.zeros((1, 2, 16), device=device)
    with pytest.raises(ValueError, match="query's dtype"):
        check_kv_dtype(q, q.half(), q.half())


@pytest.mark.usefixtures("row_independent_dot")
@pytest.mark.parametrize(("dtype", "window"), [(torch.float32, None), (torch.bfloat16, 23)])
def test_row_bits_do_not_depend_on_tile_batch_or_config(device, dtype, window):
    """One row (the last token of a 150-token sequence) computed as a decode in a 16-row tile, as
    the end of a chunk on cached context, inside a fresh prompt, and beside other sequences in
    128-row tiles: the same bits whenever the key tile size is the same."""
    from pagoda.kernels.prefill_attention import launch_prefill_attention

    h, hkv, d, bs, n = 8, 2, 32, 16, 150
    pool = 64
    k_cache = torch.randn(pool, bs, hkv, d).to(device, dtype)
    v_cache = torch.randn(pool, bs, hkv, d).to(device, dtype)
    perm = torch.randperm(pool).tolist()
    table, rest = perm[:10], perm[10:]
    q_all = torch.randn(n, h, d).to(device, dtype)
    others = [(90, torch.randn(30, h, d).to(device, dtype), rest[:6]),
              (7, torch.randn(7, h, d).to(device, dtype), rest[6:7])]  # fmt: skip
    cases = {
        "decode": ([(n, q_all[-1:], table)], "m16-t16", True),
        "chunk": ([(n, q_all[-45:], table)], "m128-t64", False),
        "fresh prompt": ([(n, q_all, table)], "m128-t64", False),
        "chunk beside others": ([*others, (n, q_all[-45:], table)], "m64-t32", False),
        "decode beside others": ([*others, (n, q_all[-1:], table)], "m128-t64", False),
    }
    got = {}
    for name, (seqs, config, one_token) in cases.items():
        width = max(len(t) for *_, t in seqs)
        qlens = [q.shape[0] for _, q, _ in seqs]
        qsl = torch.tensor([0, *qlens]).cumsum(0).to(device, torch.int32)
        out = torch.empty((sum(qlens), h, d), device=device, dtype=dtype)
        launch_prefill_attention(
            q=torch.cat([q for _, q, _ in seqs]), k_cache=k_cache, v_cache=v_cache,
            block_tables=torch.tensor([t + [0] * (width - len(t)) for *_, t in seqs],
                                      dtype=torch.int32, device=device),
            seq_lens=torch.tensor([s for s, *_ in seqs], dtype=torch.int32, device=device),
            query_start_loc=qsl, scale=d**-0.5, out=out, first_seq=0, last_seq=len(seqs),
            first_token=0, last_token=sum(qlens),
            config={**CONFIGS[config], "TILE_SIZE": 32}, one_token_per_seq=one_token,
            sliding_window=window,
        )  # fmt: skip
        got[name] = out[-1]
        assert torch.equal(got[name], got["decode"]), name


@pytest.mark.usefixtures("row_independent_dot")
def test_paged_attention_invariant_mode_uses_one_tile_size(device, monkeypatch):
    """Batch-invariant ``paged_attention`` gives the decode and the prefill launch the decode
    config's TILE_SIZE, even where the prefill bucket asks for another."""
    from pagoda.kernels import attention

    real = attention.get_kernel_config

    def configs(kernel, shape, dev=None):
        cfg = real(kernel, shape, dev)
        if kernel == attention.FLASH:
            big = shape["max_query_len"] > 1
            cfg.update(BLOCK_M=128 if big else 16, TILE_SIZE=64 if big else 16)
        return cfg

    monkeypatch.setattr(attention, "get_kernel_config", configs)
    decode, prefill = attention.flash_configs(32, 512, device, batch_invariant=True)
    assert decode["TILE_SIZE"] == prefill["TILE_SIZE"] == 16 and prefill["BLOCK_M"] == 128
    assert attention.flash_configs(32, 512, device, batch_invariant=False)[1]["TILE_SIZE"] == 64
    batch = make_batch(
        mixed_seqs(16), num_heads=4, num_kv_heads=2, head_dim=32, block_size=16,
        dtype=torch.float32, device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=32**-0.5)
    out = attention.paged_attention(**args, num_decodes=batch.num_decodes, batch_invariant=True)
    torch.testing.assert_close(out, reference.paged_attention(**args), **TOL[torch.float32])
    # the decode rows equal their own decode-only batch, bit for bit
    alone = attention.paged_attention(
        **{**args, "q": args["q"][:4], "block_tables": args["block_tables"][:4],
           "seq_lens": args["seq_lens"][:4], "query_start_loc": args["query_start_loc"][:5],
           "max_query_len": 1}, batch_invariant=True,
    )  # fmt: skip
    assert torch.equal(alone, out[:4])


def test_gpu_llama3_8b_shapes(device):
    """Compiled (gpu only): Llama-3-8B heads with the device's configs, a 2048-token prompt and a
    512-token chunk over 3k of cache, against the reference; the last row of the chunk equals
    its decode, bit for bit, in batch-invariant mode."""
    if device.type != "cuda":
        pytest.skip("model-sized shapes are for compiled kernels")
    from pagoda.kernels import paged_attention

    batch = make_batch(
        [(2048, 2048), (512, 3584)], num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
        dtype=torch.bfloat16, device=device,
    )  # fmt: skip
    args = batch.attention_args(scale=128**-0.5)
    want = reference.paged_attention(**args)
    for invariant in (False, True):
        got = paged_attention(**args, num_decodes=0, batch_invariant=invariant)
        torch.testing.assert_close(got, want, **TOL[torch.bfloat16])
    decode = {
        **args, "q": args["q"][-1:], "block_tables": args["block_tables"][1:],
        "seq_lens": args["seq_lens"][1:],
        "query_start_loc": torch.tensor([0, 1], dtype=torch.int32, device=device),
        "max_query_len": 1,
    }  # fmt: skip
    alone = paged_attention(**decode, batch_invariant=True)
    chunk = paged_attention(**args, num_decodes=0, batch_invariant=True)
    assert torch.equal(alone[0], chunk[-1])
