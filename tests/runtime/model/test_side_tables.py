"""`model/side_tables.py`: the pools a step's tokens end (`ends`: through the block tables, for
pools longer and shorter than a block, a padding row ending none), their rows written once
(`PoolTable.close`) where `gather` reads them, and a table's bytes a block (`Spec`). The
families' own runs (tokens against transformers, the pool's bytes against the estimate) are in
their tests (`arch_cases.check_side_table_bytes`)."""

from __future__ import annotations

import torch
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model.side_tables import PoolTable, Spec, ends

# block size 4: sequence 0's positions 5..12 (a chunk), sequence 1's 7 (a decode), a padding
# row (a CUDA graph's: length 0, slot -1)
TABLES = torch.tensor([[3, 0, 5, 1], [2, 4, 0, 0], [0, 0, 0, 0]], dtype=torch.int32)


def _slot(seq: int, pos: int) -> int:
    return int(TABLES[seq, pos // 4]) * 4 + pos % 4


def step(host: bool = False) -> AttentionMetadata:
    """The step, its lengths on the host too (``host``: an eager step's; no padding row then)."""
    slots = [_slot(0, p) for p in range(5, 13)] + [_slot(1, 7), -1]
    meta = AttentionMetadata(
        num_seqs=3, num_decodes=0, num_tokens=10, max_query_len=8, max_seq_len=13,
        query_start_loc=torch.tensor([0, 8, 9, 10], dtype=torch.int32),
        seq_lens=torch.tensor([13, 8, 0], dtype=torch.int32), block_tables=TABLES,
        slot_mapping=torch.tensor(slots), block_size=4,
    )  # fmt: skip
    if host:
        meta.query_lens_host, meta.seq_lens_host = [8, 1, 0], [13, 8, 0]
    return meta


def test_the_pools_a_step_ends():
    meta = step()  # a candidate pool a token (as a CUDA graph's decode step takes them)
    e = ends(meta, 8)  # pools over two blocks
    assert e.end.tolist() == [False, False, True, *[False] * 5, True, False]  # positions 7, 7
    assert e.slots[2].tolist() == [_slot(0, p) for p in range(8)] == [12, 13, 14, 15, 0, 1, 2, 3]
    assert e.slots[8].tolist() == [_slot(1, p) for p in range(8)]
    assert e.first[2] == e.first[8] == 0
    e = ends(meta, 2)  # pools within a block
    assert e.end.nonzero().flatten().tolist() == [0, 2, 4, 6, 8]  # positions 5, 7, 9, 11; 7
    assert e.slots[4].tolist() == [_slot(0, 8), _slot(0, 9)] and e.first[4] == 8
    assert ends(meta, 2) is e  # once a step and size
    for size in (8, 2):  # a step with prompt rows: the host's lengths, a row a pool
        h, d = ends(step(host=True), size), ends(step(), size)
        assert h.end.all() and h.tok.tolist() == d.tok[d.end].tolist()
        assert torch.equal(h.slots, d.slots[d.end]) and torch.equal(h.first, d.first[d.end])


def test_a_pool_row_is_written_once_where_gather_reads_it():
    for meta in (step(), step(host=True)):
        cache = torch.zeros(6, 4, 1, 8)  # 6 blocks of 4 slots
        table = PoolTable(8, 3)
        table.bind(cache, 24, torch.float32, block_size=4)
        assert table.rows.shape == (24 // 4 + 1, 3)  # a row a block (gcd(8, 4)) and the spare
        table.close(meta, lambda slots, first: torch.stack([slots[:, 0], slots[:, -1], first], 1))
        positions = torch.arange(16)
        seq0 = TABLES[0, positions // 4].long() * 4 + positions % 4  # sequence 0's slots [16]
        assert table.gather(seq0[None], 1)[0].tolist() == [[12.0, 3.0, 0.0]]  # its pool 0
        seq1 = TABLES[1, positions[:8] // 4].long() * 4 + positions[:8] % 4
        assert table.gather(seq1[None], 1)[0].tolist() == [[8.0, 19.0, 0.0]]
        written = table.rows[:-1].abs().sum(1).nonzero().flatten().tolist()
        assert written == [_slot(0, 7) // 4, _slot(1, 7) // 4]  # nothing else (the rest: spare)


def test_a_tables_bytes_a_block():
    assert Spec(16).block_bytes(16, 4) == 16 * 16 * 4  # a raw key a slot
    assert Spec(16, 4, 16).block_bytes(16, 4) == (16 * 16 + 4 * 16) * 4  # and 4 pools a block
    assert Spec(0, 64, 8).block_bytes(16, 2) == 8 * 2  # a pool over 4 blocks: a row a block
