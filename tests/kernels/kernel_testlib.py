"""Builders shared by the kernel tests: ragged paged batches and dtype tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch

TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
}


@dataclass
class PagedBatch:
    """A flattened batch (decodes first) over a paged cache, as the runtime hands it over."""

    q: torch.Tensor  # [T, H, D]
    k_new: torch.Tensor  # [T, Hkv, D] this step's keys (already in the cache unless noted)
    v_new: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]
    query_start_loc: torch.Tensor  # int32 [B + 1]
    slot_mapping: torch.Tensor  # int64 [T]
    query_lens: list[int]
    seq_lens_host: list[int]
    num_decodes: int

    def attention_args(self, scale: float) -> dict:
        return {
            "q": self.q,
            "k_cache": self.k_cache,
            "v_cache": self.v_cache,
            "block_tables": self.block_tables,
            "seq_lens": self.seq_lens,
            "query_start_loc": self.query_start_loc,
            "max_query_len": max(self.query_lens),
            "max_seq_len": max(self.seq_lens_host),
            "scale": scale,
        }


def make_batch(
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    num_blocks: int | None = None,
    blocks_at_end: bool = False,
    fill_new: bool = True,
) -> PagedBatch:
    """``seqs`` = [(query_len, seq_len)], decodes (query_len 1) first.

    Blocks are a random permutation (or the last ids of a ``num_blocks`` pool when
    ``blocks_at_end``). Only owned blocks are initialised, so a huge pool stays a lazy
    allocation. With ``fill_new=False`` the new tokens' K/V are not yet in the cache.
    """
    num_decodes = 0
    while num_decodes < len(seqs) and seqs[num_decodes][0] == 1:
        num_decodes += 1
    per_seq = [-(-s // block_size) for _, s in seqs]
    needed = sum(per_seq)
    num_blocks = num_blocks or needed + 3
    if blocks_at_end:
        ids = torch.arange(num_blocks - needed, num_blocks)
    else:
        ids = torch.randperm(num_blocks)[:needed]
    k_cache = torch.empty(
        (num_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, device=device
    )
    v_cache = torch.empty_like(k_cache)
    if blocks_at_end or num_blocks > 4 * needed:
        k_cache[ids] = torch.randn((needed, block_size, num_kv_heads, head_dim)).to(device, dtype)
        v_cache[ids] = torch.randn((needed, block_size, num_kv_heads, head_dim)).to(device, dtype)
    else:
        k_cache.copy_(torch.randn(k_cache.shape).to(dtype))
        v_cache.copy_(torch.randn(v_cache.shape).to(dtype))
    block_tables = torch.zeros((len(seqs), max(per_seq) + 1), dtype=torch.int32)
    slots: list[int] = []
    start = 0
    for i, ((q_len, s_len), n) in enumerate(zip(seqs, per_seq, strict=True)):
        table = ids[start : start + n]
        block_tables[i, :n] = table.to(torch.int32)
        start += n
        for pos in range(s_len - q_len, s_len):
            slots.append(int(table[pos // block_size]) * block_size + pos % block_size)
    q_lens = [q for q, _ in seqs]
    num_tokens = sum(q_lens)
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    k_new = torch.randn((num_tokens, num_kv_heads, head_dim)).to(device, dtype)
    v_new = torch.randn((num_tokens, num_kv_heads, head_dim)).to(device, dtype)
    if fill_new:
        flat_k = k_cache.view(-1, num_kv_heads, head_dim)
        flat_v = v_cache.view(-1, num_kv_heads, head_dim)
        flat_k[slot_mapping.to(device)] = k_new
        flat_v[slot_mapping.to(device)] = v_new
    return PagedBatch(
        q=torch.randn((num_tokens, num_heads, head_dim)).to(device, dtype),
        k_new=k_new,
        v_new=v_new,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor([s for _, s in seqs], dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device),
        slot_mapping=slot_mapping.to(device),
        query_lens=q_lens,
        seq_lens_host=[s for _, s in seqs],
        num_decodes=num_decodes,
    )


def mixed_seqs(block_size: int) -> list[tuple[int, int]]:
    """Ragged lengths at the edges: 1 token, exactly one block, either side of a block boundary,
    a prefill from scratch, chunks with cached context, and a one-token chunk among prefills."""
    bs = block_size
    return [
        (1, 1),  # decode, first token
        (1, bs),  # decode, exactly one block
        (1, bs + 1),  # decode, one past a boundary
        (1, 2 * bs - 1),  # decode, one before a boundary
        (bs, bs),  # prefill from scratch, exactly one block
        (3, 2 * bs),  # chunk ending on a boundary, with context
        (7, 3 * bs + 2),  # chunk crossing a boundary
        (1, 5),  # one-token chunk scheduled as a prefill
        (2 * bs + 3, 2 * bs + 3),  # longer prefill from scratch
    ]
