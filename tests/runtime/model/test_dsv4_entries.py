"""DeepSeek-V4's per-block entry tables (`model/dsv4_entries.py`) with the open-window slot
(`dsv4_compressor.step_entries`): two sequences stepped in ragged chunks write their entries
through their block tables (16-token blocks, out of order), and read back the whole sequences'
entries; a third sequence that reuses the first one's first block from the prefix cache restores
its CSA slot from that block's tail and, stepping only its own tokens, reads the whole
sequence's entries too (the shared block's entries written once, by the first)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import dsv4_entries as T
from pagoda.runtime.model.dsv4_compressor import compress, step_entries

D, BS, NUM_BLOCKS = 8, 16, 8
RATES = {"csa": 4, "hca": 8}


def _rows(n, c, g):
    return torch.randn(n, c, generator=g), torch.randn(n, c, generator=g)


def _run(rows, tables, steps, rate, overlap, table, tails, done, slot):
    """Step the sequences (`rows`: per sequence (kv, gate) [n, C]) in `steps` chunks."""
    c = rows[0][0].shape[1]
    bias = torch.linspace(-1, 1, rate * c).view(rate, c)
    w = torch.linspace(0.5, 1.5, D)
    slot_kv, slot_gate = slot
    for qs in steps:
        q, width = torch.tensor(qs), max(max(qs), 1)
        new = [torch.zeros(len(rows), width, c), torch.zeros(len(rows), width, c)]
        for b in range(len(rows)):  # (the test's inputs: the engine has them in the step)
            a = int(done[b])
            for i in range(2):
                new[i][b, : qs[b]] = rows[b][i][a : a + qs[b]]
        entries, first, keep, slot_kv, slot_gate = step_entries(
            slot_kv, slot_gate, new[0], new[1], done, q, bias, w, 1e-6, rate, overlap
        )
        T.write_entries(table, tables, first, entries, keep, rate)
        done = done + q
        if overlap:
            T.write_tails(tails, tables, done, slot_kv, slot_gate, BS)
    return done, bias, w


@pytest.mark.parametrize("kind", list(RATES))
def test_entries_through_block_tables_and_a_prefix_hit(kind):
    rate, overlap = RATES[kind], kind == "csa"
    c = 2 * D if overlap else D
    g = torch.Generator().manual_seed(0)
    table = torch.zeros(NUM_BLOCKS, BS // rate, D)
    tails = torch.zeros(NUM_BLOCKS, rate, 2 * c)
    lens = (37, 21)
    rows = [_rows(n, c, g) for n in lens]
    tables = torch.tensor([[5, 2, 7], [1, 6, 0]])
    empty = (torch.zeros(2, 0, c), torch.zeros(2, 0, c))
    done, bias, w = _run(rows, tables, ((5, 3), (11, 1), (9, 16), (12, 1)), rate, overlap,
                         table, tails, torch.zeros(2, dtype=torch.long), empty)  # fmt: skip
    assert done.tolist() == list(lens)

    def whole(kv, gate):
        n = kv.shape[0] // rate * rate
        return compress(kv[None, :n], gate[None, :n], bias, w, 1e-6, rate, overlap)[0]

    got, valid = T.read_entries(table, tables, done // rate, rate)
    for b, n in enumerate(lens):
        assert int(valid[b].sum()) == n // rate
        torch.testing.assert_close(got[b, : n // rate], whole(*rows[b]))
    # a third sequence: the first's first 16 tokens (block 5, from the prefix cache), then its own
    mine = _rows(14, c, g)
    rows3 = [tuple(torch.cat([rows[0][i][:BS], mine[i]]) for i in range(2))]
    tables3 = torch.tensor([[5, 3, 4]])
    cached = torch.tensor([BS])
    slot = T.restore_slot(tails, tables3, cached, BS) if overlap else (
        torch.zeros(1, 0, c), torch.zeros(1, 0, c))  # fmt: skip
    done3, _, _ = _run(rows3, tables3, ((6,), (1,), (7,)), rate, overlap, table, tails,
                       cached, slot)  # fmt: skip
    got, _ = T.read_entries(table, tables3, done3 // rate, rate)
    torch.testing.assert_close(got[0], whole(*rows3[0]))


def test_block_tails_of_a_chunk_that_fills_several_blocks():
    """`write_block_tails`: a step from token 3 to 21 (8-token blocks, rate 4) fills blocks 0
    and 1: their tails are tokens 4..7 and 12..15 of the span (slot rows 0..2, then the step's),
    kv then gate; a second sequence whose step fills none writes nothing."""
    from pagoda.runtime.model.dsv4_compressor import slot_start

    rate, bs, c = 4, 8, 2
    done, count = torch.tensor([3, 9]), torch.tensor([18, 2])
    start = slot_start(done, rate, True)  # 0 and 4
    tok = start[:, None] + torch.arange(24)[None, :]  # the span's absolute positions
    span_kv = tok[..., None].float().expand(-1, -1, c).clone()
    span_gate = -span_kv
    tables = torch.tensor([[5, 2, 7], [0, 1, 3]])
    tails = torch.full((8, rate, 2 * c), 99.0)
    T.write_block_tails(tails, tables, start, span_kv, span_gate, done, count, bs)
    for block, first in ((5, 4), (2, 12)):
        want = torch.arange(first, first + rate).float()[:, None].expand(-1, c)
        torch.testing.assert_close(tails[block], torch.cat([want, -want], dim=-1))
    untouched = [b for b in range(8) if b not in (5, 2)]
    assert (tails[untouched] == 99).all()
