"""Attention metadata for hand-built CPU steps, shared by the row-invariance tests."""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.attention.base import AttentionMetadata


def step_meta(seqs, slots, block_size: int) -> AttentionMetadata:
    """`seqs` = [(context length incl. new tokens, new tokens, block table)], decodes first;
    `slots` = the new tokens' cache slots in order."""
    width = max(len(t) for _, _, t in seqs)
    qlens = [m for _, m, _ in seqs]
    return AttentionMetadata(
        num_seqs=len(seqs),
        num_decodes=sum(1 for m in qlens if m == 1),
        num_tokens=sum(qlens),
        max_query_len=max(qlens),
        max_seq_len=max(c for c, _, _ in seqs),
        query_start_loc=torch.from_numpy(np.cumsum([0, *qlens]).astype(np.int32)),
        seq_lens=torch.tensor([c for c, _, _ in seqs], dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for _, _, t in seqs]).int(),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_size=block_size,
        query_lens_host=qlens,
        seq_lens_host=[c for c, _, _ in seqs],
    )


def scattered_tables(contexts, block_size: int, num_blocks: int, generator):
    """Block tables for sequences of `contexts` tokens over a random permutation of the cache's
    blocks, and each sequence's slots (token t at block ``t // block_size``)."""
    width = max(-(-c // block_size) for c in contexts)
    tables = torch.zeros(len(contexts), width, dtype=torch.int32)
    perm, used, slots = torch.randperm(num_blocks, generator=generator).tolist(), 0, []
    for i, c in enumerate(contexts):
        n = -(-c // block_size)
        tables[i, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
        slots.append(torch.tensor([int(tables[i, t // block_size]) * block_size + t % block_size
                                   for t in range(c)]))  # fmt: skip
    return tables, slots
