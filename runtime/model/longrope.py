"""Which of LongRoPE's two rotary tables a token reads (`rope_scaling` type longrope, Phi-3's).

LongRoPE rescales the rotary frequencies by `short_factor` for sequences within the model's
`original_max_position_embeddings` and by `long_factor` for longer ones. transformers decides
per forward: the positions of a forward whose sequence reaches past the original context
(max(position_ids) + 1 > original) are rotated with the long factors, the others with the short
ones; keys already cached keep the rotation they were stored with. Generating, a prompt within
the original context is prefilled short and the tokens generated past it are rotated long; a
longer prompt is long throughout.

The engine reproduces that whatever the chunking: `ops.build_cos_sin_cache` stacks the short
table's rows over the long one's, and `table_rows` moves a token to the long rows when its
request's prompt (`AttentionMetadata.prompt_lens`, so a long prompt's first chunks too) or its
context in this step (`seq_lens`) passes the original context. `cache_salt` keeps a long
prompt's blocks (long throughout) and a short prompt's (short up to the original context) from
serving each other through the prefix cache. (vLLM picks per batch instead: a short sequence
batched with a long one is rotated long there.) A request preempted past the original context
whose blocks were evicted is recomputed by the same rule, chunk by chunk (a chunk that passes
the original context is rotated long).
"""

from __future__ import annotations

from typing import Any

import torch
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.ops import rope_kind


def original_context(scaling: dict[str, Any] | None) -> int | None:
    """The context past which a sequence is rotated long; None unless `scaling` is longrope."""
    if rope_kind(scaling) != "longrope":
        return None
    return int(scaling["original_max_position_embeddings"])


def table_rows(
    positions: torch.Tensor, meta: AttentionMetadata, original: int, rows_per_table: int
) -> torch.Tensor:
    """The row of the stacked short/long table each token reads: its position, plus
    `rows_per_table` where its sequence's context this step exceeds `original`. Device work
    only (no host sync): the token's sequence from `query_start_loc`."""
    ends = meta.query_start_loc[1:]
    tokens = torch.arange(positions.shape[0], device=positions.device, dtype=ends.dtype)
    seq = torch.searchsorted(ends, tokens, right=True).clamp_(max=max(ends.numel() - 1, 0))
    lens, prompts = meta.seq_lens, meta.prompt_lens
    lens = lens if prompts is None else torch.maximum(lens, prompts)  # a prompt's chunks: long
    long = lens.index_select(0, seq.long()) > original
    return positions + long.to(positions.dtype) * rows_per_table


def cache_salt(scaling: dict[str, Any] | None, prompt_len: int) -> bytes | None:
    """The prefix-cache salt of a request whose prompt is longer than longrope's original
    context: its blocks are rotated long throughout, and a shorter prompt's (rotated short up
    to where it passed the original context) must not serve it, nor it them. None otherwise."""
    original = original_context(scaling)
    return LONG_SALT if original is not None and prompt_len > original else None


LONG_SALT = b"longrope: long factors"
