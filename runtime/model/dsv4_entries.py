"""DeepSeek-V4's per-block entry tables (the design: docs/runtime.md, "DeepSeek-V4 in the
engine"): beside a layer's paged token rows, each KV block holds the compressed entries of its
windows (``block_size / rate`` rows of ``D``: `entries` ``[num_blocks, block_size / rate, D]``)
and, for CSA, its last window's compressor rows (the "Ca tail": `tails` ``[num_blocks, rate,
2 C]``, kv then gate) from which a sequence that reuses the block from the prefix cache
restores its open-window slot (`dsv4_compressor.slot_start`: at a block boundary CSA's slot is
that window, HCA's is empty). Addressed through the sequences' block tables, as the token rows
are, so prefix caching shares them, and preemption frees and recomputes them; ``block_size``
must be a multiple of the rates. Batched tensor indexing only (no per-sequence loop).
"""

from __future__ import annotations

import torch


def entry_rows(
    block_tables: torch.Tensor, w: torch.Tensor, rate: int, block_size: int
) -> torch.Tensor:
    """The flat row (of ``entries.view(-1, D)``) of each sequence's entry ``w`` [B, W]:
    its window's first token's block, then the window's place in it."""
    per_block = block_size // rate
    tok = w * rate
    block = block_tables.gather(1, (tok // block_size).clamp(max=block_tables.shape[1] - 1))
    return block.long() * per_block + (tok % block_size) // rate


def write_entries(
    entries_table: torch.Tensor,  # [num_blocks, block_size / rate, D]
    block_tables: torch.Tensor,  # [B, blocks]
    first: torch.Tensor,  # [B] absolute index of new[:, 0]
    new: torch.Tensor,  # [B, W, D]
    keep: torch.Tensor,  # bool [B, W]: the entries to write
    rate: int,
) -> None:
    """Write the kept entries (`dsv4_compressor.step_entries`'s) into their blocks' rows."""
    per_block, d = entries_table.shape[1], entries_table.shape[2]
    w = first[:, None] + torch.arange(new.shape[1], device=new.device)[None, :]
    rows = entry_rows(block_tables, w, rate, per_block * rate)
    flat = entries_table.view(-1, d)
    flat.index_copy_(0, rows[keep], new[keep].to(flat.dtype))


def read_entries(
    entries_table: torch.Tensor,
    block_tables: torch.Tensor,
    count: torch.Tensor,
    rate: int,
    most: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(entries [B, E, D], valid bool [B, E]) of each sequence's first ``count[b]`` entries,
    padded to the longest (``most``: that longest, from the host; None: read from the device)."""
    per_block, d = entries_table.shape[1], entries_table.shape[2]
    e = max(int(count.max()) if most is None else most, 0)
    w = torch.arange(e, device=count.device)[None, :].expand(count.shape[0], -1)
    rows = entry_rows(block_tables, w, rate, per_block * rate)
    return entries_table.view(-1, d)[rows], w < count[:, None]


def write_tails(
    tails: torch.Tensor,  # [num_blocks, rate, 2 C]
    block_tables: torch.Tensor,
    done: torch.Tensor,  # [B] tokens cached after the step
    slot_kv: torch.Tensor,  # [B, S, C] the slot after the step (`step_entries`)
    slot_gate: torch.Tensor,
    block_size: int,
) -> None:
    """CSA: where a sequence's cached tokens end on a block boundary, its slot (that block's
    last window, `slot_start`) into the block's tail."""
    rate = tails.shape[1]
    if slot_kv.shape[1] < rate:  # no sequence ends on a window boundary with a full window
        return
    full = (done > 0) & (done % block_size == 0)
    block = block_tables.gather(1, ((done - 1) // block_size).clamp(min=0)[:, None])[:, 0]
    rows = torch.cat([slot_kv[:, :rate], slot_gate[:, :rate]], dim=-1)
    tails.index_copy_(0, block[full].long(), rows[full].to(tails.dtype))


def restore_slot(
    tails: torch.Tensor, block_tables: torch.Tensor, cached: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSA's slot (kv, gate) [B, rate, C] of sequences whose first ``cached[b]`` tokens (a
    multiple of ``block_size``, > 0) come from the prefix cache: their last block's tail."""
    block = block_tables.gather(1, ((cached - 1) // block_size)[:, None])[:, 0]
    rows = tails[block.long()]
    c = rows.shape[-1] // 2
    return rows[..., :c], rows[..., c:]


def write_block_tails(
    tails: torch.Tensor,  # [num_blocks, rate, 2 C]
    block_tables: torch.Tensor,
    start: torch.Tensor,  # [B] the absolute position of span[:, 0] (`slot_start(done)`)
    span_kv: torch.Tensor,  # [B, S, C] the slot's rows then the step's (`step_span`)
    span_gate: torch.Tensor,
    done: torch.Tensor,  # [B] tokens cached before the step
    count: torch.Tensor,  # [B] the step's tokens
    block_size: int,
    most: int | None = None,  # the most block ends a sequence's step crosses (host), or None
) -> None:
    """CSA: the Ca tail (last window's rows) of every block the step fills, wherever the step
    ends (a chunk may fill several blocks): for each block end ``P`` in ``(done, done + count]``
    the span's rows of tokens ``[P - rate, P)``."""
    rate = tails.shape[1]
    first = done // block_size + 1  # the first block end past done, in blocks
    m = max(int(((done + count) // block_size - first + 1).max()) if most is None else most, 0)
    if m == 0:
        return
    ends = (first[:, None] + torch.arange(m, device=done.device)[None, :]) * block_size  # [B, M]
    valid = ends <= (done + count)[:, None]
    j = (ends - start[:, None])[..., None] - rate + torch.arange(rate, device=done.device)
    j = j.clamp(0, span_kv.shape[1] - 1)  # [B, M, rate] span positions
    c = span_kv.shape[-1]
    rows = torch.cat(
        [
            span_kv.gather(1, j.view(len(j), -1, 1).expand(-1, -1, c)),
            span_gate.gather(1, j.view(len(j), -1, 1).expand(-1, -1, c)),
        ],
        dim=-1,
    )
    rows = rows.view(len(j), m, rate, 2 * c)
    blk = (ends // block_size - 1).clamp(max=block_tables.shape[1] - 1)
    block = block_tables.gather(1, blk).long()
    tails.index_copy_(0, block[valid], rows[valid].to(tails.dtype))
