"""TritonAttentionBackend.forward against the torch backend (and the reference) on one step."""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL, make_batch, mixed_seqs
from pagoda.kernels import reference
from pagoda.runtime.attention import AttentionMetadata, get_attention_backend


def _meta(batch, block_size: int) -> AttentionMetadata:
    fields = AttentionMetadata.__dataclass_fields__
    extra = {"block_size": block_size} if "block_size" in fields else {}
    return AttentionMetadata(
        num_seqs=len(batch.query_lens),
        num_decodes=batch.num_decodes,
        num_tokens=sum(batch.query_lens),
        max_query_len=max(batch.query_lens),
        max_seq_len=max(batch.seq_lens_host),
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        slot_mapping=batch.slot_mapping,
        query_lens_host=list(batch.query_lens),
        seq_lens_host=list(batch.seq_lens_host),
        **extra,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_triton_backend_matches_torch_backend(device, dtype):
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16  # SmolLM2's GQA layout
    batch = make_batch(
        mixed_seqs(block_size),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        fill_new=False,  # forward() must write this step's K/V itself
    )
    scale = head_dim**-0.5
    triton_be = get_attention_backend("triton", device, heads, kv_heads, head_dim, scale)
    assert triton_be.name == "triton"
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    meta = _meta(batch, block_size)
    triton_be.prepare(meta)
    got = triton_be.forward(batch.q, batch.k_new, batch.v_new, k_cache, v_cache, meta)

    # Expected cache: the reference scatter. Expected output: the torch backend when it is
    # present (same step, same metadata), and the kernel reference in any case.
    exp_k, exp_v = batch.k_cache.clone(), batch.v_cache.clone()
    reference.write_kv_cache(
        k=batch.k_new, v=batch.v_new, k_cache=exp_k, v_cache=exp_v, slot_mapping=batch.slot_mapping
    )
    assert torch.equal(k_cache, exp_k) and torch.equal(v_cache, exp_v)
    args = batch.attention_args(scale)
    expected = reference.paged_attention(**{**args, "k_cache": exp_k, "v_cache": exp_v})
    torch.testing.assert_close(got, expected, **TOL[dtype])

    try:
        torch_be = get_attention_backend("torch", device, heads, kv_heads, head_dim, scale)
    except ImportError:  # the torch backend is optional for this comparison
        return
    # the torch backend keeps its own cache layout (packed for its CPU kernel, or head-major):
    # write the whole context in through it
    nb, bs = batch.k_cache.shape[:2]
    k2, v2 = torch_be.allocate_kv_cache(nb, bs, dtype, batch.k_cache.device)
    slots = torch.arange(nb * bs, device=batch.k_cache.device)
    flat = (c.reshape(nb * bs, kv_heads, head_dim) for c in (batch.k_cache, batch.v_cache))
    torch_be.write_kv(*flat, k2, v2, slots)
    meta2 = _meta(batch, block_size)
    torch_be.prepare(meta2)
    want = torch_be.forward(batch.q, batch.k_new, batch.v_new, k2, v2, meta2)
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_auto_picks_torch_on_cpu():
    be = get_attention_backend("auto", torch.device("cpu"), 4, 2, 64, 0.125)
    assert be.name == "torch"


def test_image_spans_match_the_torch_backend(device):
    """`IMAGE_SPANS` in the step (Gemma 3's images): the Triton backend's prefill kernel (not
    SDPA, not batch-invariant) and the torch backend's masked path, a window layer of 4 keys
    (shorter than the images), a decode beside a fresh prompt and a chunk on cached context,
    each with an image."""
    import numpy as np
    from pagoda.runtime.attention.base import IMAGE_SPANS

    heads, kv_heads, d, bs = 4, 2, 32, 16
    batch = make_batch([(1, 7), (24, 24), (12, 40)], num_heads=heads, num_kv_heads=kv_heads,
                       head_dim=d, block_size=bs, dtype=torch.float32, device=device,
                       fill_new=False)  # fmt: skip
    rows = np.array([*range(4, 13), *range(28, 34)])  # positions 3..11 and 31..36
    spans = (rows, np.repeat([3, 31], [9, 6]), np.repeat([11, 36], [9, 6]))
    out = {}
    for name in ("triton", "torch"):
        be = get_attention_backend(name, device, heads, kv_heads, d, d**-0.5, False,
                                   sliding_window=4, image_spans=True)  # fmt: skip
        nb = batch.k_cache.shape[0]
        k_cache, v_cache = be.allocate_kv_cache(nb, bs, torch.float32, device)
        slots = torch.arange(nb * bs, device=device)
        flat = (c.reshape(nb * bs, kv_heads, d) for c in (batch.k_cache, batch.v_cache))
        be.write_kv(*flat, k_cache, v_cache, slots)
        meta = _meta(batch, bs)
        meta.aux[IMAGE_SPANS] = spans
        be.prepare(meta)
        out[name] = be.forward(batch.q, batch.k_new, batch.v_new, k_cache, v_cache, meta, window=4)
    torch.testing.assert_close(out["triton"], out["torch"], **TOL[torch.float32])
