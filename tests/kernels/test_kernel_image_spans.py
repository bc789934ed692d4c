"""Bidirectional image spans in the prefill kernel (`kernels/image_spans.py`, Gemma 3's images)
against the torch reference with spans: fresh prompts and chunks on cached context whose image
rows cross query and key tiles, sliding windows shorter than an image, every launch of
`paged_attention` (the decodes beside them, batch-invariant or not, in head groups); the rows
outside images keep their bits, and an image row's bits do not depend on its query tile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_testlib import TOL, make_batch
from pagoda.kernels import reference
from pagoda.kernels.image_spans import NO_SPAN, span_table

CONFIGS = {
    "m16-t16": {"BLOCK_M": 16, "TILE_SIZE": 16, "num_warps": 4, "num_stages": 2},
    "m64-t32": {"BLOCK_M": 64, "TILE_SIZE": 32, "num_warps": 4, "num_stages": 2},
}
# Two decodes, a fresh prompt with two images, a chunk on 30 cached tokens with one image,
# a text-only prompt; (query_len, seq_len) as `make_batch` takes them.
SEQS = [(1, 9), (1, 40), (40, 40), (20, 50), (12, 12)]
# (sequence, first position, last position) of each image, whole in its sequence's chunk
IMAGES = [(2, 3, 11), (2, 20, 36), (3, 33, 45)]


def _spans(batch, device) -> torch.Tensor:
    """The kernels' [T, 2] spans of `IMAGES` (built as the Triton backend builds them)."""
    qsl, rows, lo, hi = batch.query_start_loc.tolist(), [], [], []
    for seq, first, last in IMAGES:
        p0 = batch.seq_lens_host[seq] - batch.query_lens[seq]
        rows += [qsl[seq] + p - p0 for p in range(first, last + 1)]
        lo += [first] * (last - first + 1)
        hi += [last] * (last - first + 1)
    table = span_table(np.array(rows), np.array(lo), np.array(hi), qsl[-1])
    return torch.from_numpy(table).to(device)


def _batch(device, dtype=torch.float32, heads=4):
    return make_batch(SEQS, num_heads=heads, num_kv_heads=2, head_dim=32, block_size=16,
                      dtype=dtype, device=device)  # fmt: skip


def _launch(batch, spans, config, window=None, first=2):
    from pagoda.kernels.prefill_attention import launch_prefill_attention

    args = batch.attention_args(scale=0.5)
    out = torch.full_like(batch.q, float("nan"))
    qsl = batch.query_start_loc.tolist()
    launch_prefill_attention(
        q=args["q"], k_cache=args["k_cache"], v_cache=args["v_cache"],
        block_tables=args["block_tables"], seq_lens=args["seq_lens"],
        query_start_loc=args["query_start_loc"], scale=0.5, out=out, first_seq=first,
        last_seq=len(SEQS), first_token=qsl[first], last_token=qsl[-1], config=config,
        sliding_window=window, image_spans=spans,
    )  # fmt: skip
    return out[qsl[first] :], args


def test_span_table():
    table = span_table(np.array([1, 2]), np.array([5, 5]), np.array([6, 6]), 4)
    assert table.tolist() == [[NO_SPAN, -1], [5, 6], [5, 6], [NO_SPAN, -1]]


@pytest.mark.parametrize(("config", "window"), [("m16-t16", 5), ("m64-t32", None)])
def test_prefill_kernel_matches_the_reference_with_spans(device, config, window):
    """Images across query tiles (16 rows) and key tiles (16, 32 keys), a window of 5 keys
    (shorter than each image: its rows see their image's start only through the span); the
    spans change the answer (the reference without them differs)."""
    batch = _batch(device)
    spans = _spans(batch, device)
    got, args = _launch(batch, spans, CONFIGS[config], window)
    want = reference.paged_attention(**args, sliding_window=window, image_spans=spans)
    torch.testing.assert_close(got, want[2:], **TOL[torch.float32])
    causal = reference.paged_attention(**args, sliding_window=window)
    assert not torch.allclose(causal[2:], got, atol=1e-3)


@pytest.mark.parametrize(("invariant", "group"), [(False, 2), (True, None)],
                         ids=["fast-head-groups", "invariant"])  # fmt: skip
def test_paged_attention_with_decodes_and_head_groups(device, invariant, group, monkeypatch):
    """Every launch of `paged_attention`: the decodes (split-KV, or the invariant decode
    launch) beside the prefill kernel's spans; in groups of 2 query heads (`max_query_heads`)."""
    from pagoda.kernels import attention

    if group is not None:
        monkeypatch.setattr(attention, "max_query_heads", lambda q: group)
    batch = _batch(device, heads=8)
    spans = _spans(batch, device)
    args = batch.attention_args(scale=0.5)
    want = reference.paged_attention(**args, sliding_window=7, image_spans=spans)
    got = attention.paged_attention(**args, num_decodes=2, batch_invariant=invariant,
                                    sliding_window=7, image_spans=spans)  # fmt: skip
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    with pytest.raises(ValueError, match="flash_prefill=False"):
        attention.paged_attention(**args, image_spans=spans, flash_prefill=False)
    with pytest.raises(ValueError, match="int32"):
        attention.paged_attention(**args, image_spans=spans.long())


@pytest.mark.usefixtures("row_independent_dot")
def test_row_bits_beside_images_and_across_query_tiles(device):
    """The rows outside images get the bits of a launch without spans (the text-only
    sequence, and the text rows around the images); every row gets the same bits from a
    16-row and a 64-row query tile of the same key tile size (batch invariance)."""
    batch = _batch(device, dtype=torch.bfloat16)
    spans = _spans(batch, device)
    tile16 = {**CONFIGS["m64-t32"], "TILE_SIZE": 16}
    small, _ = _launch(batch, spans, CONFIGS["m16-t16"], window=5)
    large, _ = _launch(batch, spans, tile16, window=5)
    assert torch.equal(small, large)
    plain, _ = _launch(batch, None, tile16, window=5)
    text = (spans[2:, 0] == NO_SPAN).cpu()
    assert 0 < int(text.sum()) < len(text)
    assert torch.equal(large[text], plain[text])
    assert not torch.equal(large[~text], plain[~text])
