"""Bidirectional image spans in the prefill kernel (Gemma 3's images: `attention.base.IMAGE_SPANS`).

A query row inside an image also sees the keys of its image up to the image's last position
(transformers' ``token_type_ids`` mask), in every layer, sliding-window layers too: its
visible keys are the causal (window, chunk) ones **or** those of its span. The kernels take one
int32 pair per step row, ``[num_tokens, 2]`` (the first and last position of the row's image;
``(NO_SPAN, -1)``, an empty span, for a row outside every image: `span_table`), under the
``HAS_SPANS`` constexpr, so a step without images compiles and runs the kernels as before.

Where it acts (`image_span_rows`, `span_visible`): a query tile's key range widens to its rows'
spans (it starts at the earliest image start of its rows and ends after the latest image end),
and only the masked tiles change: the tiles every row sees whole by the causal rule stay
unmasked (a span only adds keys), the others add ``lo <= key <= hi`` to each row's mask. Tiles
stay at multiples of ``TILE_SIZE`` from key 0 and a tile a row cannot see leaves its state
exactly as it was, so a row's bits still depend on its own inputs only (batch invariance).
Decode rows are never inside a span of more than themselves (an image is whole in its prefill
chunk), so the decode kernels take no spans.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

NO_SPAN = 1 << 30  # an empty span's first position (its last is -1)
_NO_SPAN = tl.constexpr(NO_SPAN)  # (the kernels' copy: a jit function reads constexpr globals)


def span_table(rows, first, last, num_tokens: int) -> np.ndarray:
    """The kernels' int32 ``[num_tokens, 2]`` spans from `IMAGE_SPANS`' host arrays: the step
    rows that are an image's tokens, and each one's image's first and last position."""
    table = np.empty((num_tokens, 2), dtype=np.int32)
    table[:, 0], table[:, 1] = NO_SPAN, -1
    rows = np.asarray(rows, dtype=np.int64)
    table[rows, 0], table[rows, 1] = first, last
    return table


def spans_arg(spans: torch.Tensor | None, num_tokens: int, fallback: torch.Tensor):
    """``(spans, HAS_SPANS)`` for the prefill kernel: int32 ``[num_tokens, 2]`` (module
    docstring) on the attention's device; without spans ``fallback`` stands in, never read."""
    if spans is None:
        return fallback, False
    if spans.dtype != torch.int32 or spans.shape != (num_tokens, 2) or not spans.is_contiguous():
        raise ValueError(f"image_spans must be contiguous int32 [num_tokens={num_tokens}, 2], "
                         f"got {tuple(spans.shape)} {spans.dtype}")  # fmt: skip
    if spans.device != fallback.device:
        raise ValueError(f"image_spans are on {spans.device}, the attention on {fallback.device}")
    return spans, True


@triton.jit
def image_span_rows(spans_ptr, tok, row_mask, kv_need, kv_end, HAS_SPANS: tl.constexpr):
    """``(span_lo, span_hi, kv_need, kv_end)``: each row's span ([BLOCK_M], by its step row
    ``tok``; empty for rows outside images and padding rows) and the tile's key range
    ``[kv_need, kv_end)`` widened to hold every row's span; as given without ``HAS_SPANS``.
    One ``return`` (compiled Triton type-checks every return: `attn_common.kv_scales`)."""
    span_lo = tl.full(tok.shape, _NO_SPAN, dtype=tl.int32)
    span_hi = tl.full(tok.shape, -1, dtype=tl.int32)
    if HAS_SPANS:
        span_lo = tl.load(spans_ptr + tok * 2, mask=row_mask, other=_NO_SPAN)
        span_hi = tl.load(spans_ptr + tok * 2 + 1, mask=row_mask, other=-1)
        kv_need = tl.minimum(kv_need, tl.min(span_lo, axis=0))
        kv_end = tl.maximum(kv_end, tl.max(span_hi, axis=0) + 1)
    return span_lo, span_hi, kv_need, kv_end


@triton.jit
def span_visible(visible, kv_pos, kv_mask, span_lo, span_hi, HAS_SPANS: tl.constexpr):
    """A masked tile's ``visible`` [BLOCK_M, TILE] plus each row's span keys (read ones only:
    ``kv_mask``); as given without ``HAS_SPANS``."""
    if HAS_SPANS:
        in_span = (kv_pos[None, :] >= span_lo[:, None]) & (kv_pos[None, :] <= span_hi[:, None])
        visible = visible | (in_span & kv_mask[None, :])
    return visible
