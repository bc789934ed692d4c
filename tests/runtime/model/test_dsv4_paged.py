"""DeepSeek-V4's attention over paged rows and entry tables (`dsv4_paged`), stepped: two
sequences of unequal length in two ragged chunks, their rows and entries written through
shuffled block tables (`dsv4_entries`), give every token what `dsv4_attention` gives it over its
whole sequence (sliding, CSA with the indexer's top-2 picks, HCA)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import dsv4_attention as A
from pagoda.runtime.model import dsv4_entries as E
from pagoda.runtime.model import dsv4_paged as P

H, D, DI, HI, WINDOW, BS, TOPK = 3, 8, 4, 2, 6, 8, 2
LENS, CUTS = (23, 17), (10, 7)  # two steps: [0, cut) then [cut, len)


def _whole(g, length, rate):
    """One sequence's tensors, as the layer would make them (random here)."""
    e = length // rate if rate else 0
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=r(length, H, D), rows=r(length, D), entries=r(e, D), qi=r(length, HI, DI),
                keys=r(e, DI), w=r(length, HI))  # fmt: skip


def _reference(s, rate, csa):
    length = s["rows"].shape[0]
    mask = None
    if rate:
        if csa:
            scores = A.index_scores(s["qi"][None], s["keys"][None], s["w"][None])
            mask = A.picked_entries(scores, rate, TOPK)
        else:
            mask = A.all_entries(length, s["entries"].shape[0], rate, s["rows"].device)[None]
    sinks = torch.linspace(-1, 1, H)
    entries = s["entries"][None] if rate else None
    return A.attend(s["q"][None], s["rows"][None], entries, mask, WINDOW, sinks, D**-0.5)[0]


@pytest.mark.parametrize("kind", ["sliding", "csa", "hca"])
def test_stepped_paged_attention_equals_whole_sequence(kind):
    rate = {"sliding": 0, "csa": 4, "hca": 8}[kind]
    g = torch.Generator().manual_seed(0)
    seqs = [_whole(g, n, rate) for n in LENS]
    nb = 8
    tables = torch.randperm(nb, generator=g).view(2, nb // 2)  # 4 blocks of 8 each
    rows = torch.zeros(nb * BS, D)
    per = BS // rate if rate else 1
    ent_table, key_table = torch.zeros(nb, per, D), torch.zeros(nb, per, DI)
    sinks = torch.linspace(-1, 1, H)
    got = [torch.zeros(n, H, D) for n in LENS]
    for step in range(2):
        spans = [(0, c) if step == 0 else (c, n) for c, n in zip(CUTS, LENS, strict=True)]
        seq = torch.cat([torch.full((b - a,), i) for i, (a, b) in enumerate(spans)])
        pos = torch.cat([torch.arange(a, b) for a, b in spans])

        def cat(k, spans=spans):
            return torch.cat([s[k][a:b] for s, (a, b) in zip(seqs, spans, strict=True)])

        slots = tables[seq].gather(1, (pos // BS)[:, None])[:, 0] * BS + pos % BS
        rows.index_copy_(0, slots, cat("rows"))  # the step's rows, then its closed windows
        win_slots, kept = P.window_slots(tables, seq, pos, WINDOW, BS)
        entries = picked = None
        if rate:
            done = torch.tensor([b for _, b in spans])
            first = torch.tensor([a // rate for a, _ in spans])
            new_w = int((done // rate - first).max())
            for table, key in ((ent_table, "entries"), (key_table, "keys")):
                new = torch.zeros(2, new_w, table.shape[-1])
                keep = torch.zeros(2, new_w, dtype=torch.bool)
                for i, s in enumerate(seqs):  # (test setup: the entries each step closes)
                    part = s[key][first[i] : done[i] // rate]
                    new[i, : len(part)], keep[i, : len(part)] = part, True
                E.write_entries(table, tables, first, new, keep, rate)
            count = done // rate
            entries, _ = E.read_entries(ent_table, tables, count, rate)
            allowed = P.ready(pos, entries.shape[1], rate)
            if kind == "csa":
                keys, _ = E.read_entries(key_table, tables, count, rate)
                scores = P.index_scores(cat("qi"), keys, cat("w"), seq)
                picked = P.pick(scores, allowed, TOPK)
            else:
                picked = P.every(allowed)
        out = P.attend(cat("q"), rows, win_slots, kept, entries, picked, seq, sinks, D**-0.5)
        for i, (a, b) in enumerate(spans):
            got[i][a:b] = out[seq == i]
    for s, out in zip(seqs, got, strict=True):
        torch.testing.assert_close(out, _reference(s, rate, kind == "csa"), rtol=1e-5, atol=1e-5)
