"""Block tables that persist across steps (vLLM v1's `BlockTable`).

A step's attention reads a [B, max blocks] int32 table. Rebuilding it from every request's
block list costs O(blocks): 0.3 ms at 256 sequences of 64 blocks, 0.7 ms at 128, host time that
a GPU step waits for. Here each request keeps a row of a preallocated array, written when its
block list changes (a decode gains a block every `block_size` tokens; the KV manager replaces
a request's list whenever it changes and never mutates it), and a step gathers its rows in one
indexing operation. Rows of requests that finished or were preempted are reclaimed when the
free rows run out; a preempted request that runs again is written afresh.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pagoda.runtime.core.sched_output import ScheduledRequest
from pagoda.runtime.request import RUNNING, Request


class BlockTables:
    def __init__(self, max_rows: int, max_blocks: int) -> None:
        self.table = np.zeros((max_rows, max_blocks), dtype=np.int32)
        self.lens = np.zeros(max_rows, dtype=np.int64)  # blocks written per row
        self._row: dict[str, int] = {}  # request id -> its row
        # per row: the request, the block list written and its num_preemptions then
        self._holder: list[tuple[Request, list[int], int] | None] = [None] * max_rows
        self._free = list(range(max_rows - 1, -1, -1))
        self.rows = np.empty(0, dtype=np.int64)  # the last gathered step's rows

    def request(self, row: int) -> Request | None:
        """The request that holds `row` (None: a free row)."""
        held = self._holder[row]
        return None if held is None else held[0]

    def gather(self, scheduled: Sequence[ScheduledRequest]) -> np.ndarray:
        """The scheduled requests' tables, [B, their most blocks], zero-padded."""
        rows = np.empty(len(scheduled), dtype=np.int64)
        holder = self._holder
        for i, s in enumerate(scheduled):
            row = self._row.get(s.request.request_id)
            if row is None or holder[row][1] is not s.block_ids:
                row = self._write(s.request, s.block_ids, row)
            rows[i] = row
        self.rows = rows
        width = int(self.lens[rows].max()) if len(rows) else 0
        return self.table[rows, : max(width, 1)]

    def _write(self, req: Request, block_ids: list[int], row: int | None) -> int:
        """(Re)write a request's row. While a request keeps running its list only grows, so
        only the new blocks are copied; after a preemption, or for a new request reusing a
        finished one's id (and its row), the list is written from the start."""
        epoch = req.num_preemptions
        if row is None:
            row = self._claim()
            self._row[req.request_id] = row
        held = self._holder[row]
        kept = held is not None and held[0] is req and held[2] == epoch
        n, had = len(block_ids), int(self.lens[row])
        if n > self.table.shape[1]:
            raise ValueError(f"{n} blocks exceed the table's {self.table.shape[1]} per request")
        start = had if kept and n >= had else 0
        self.table[row, start:n] = block_ids[start:]
        self.table[row, n:had] = 0
        self.lens[row] = n
        self._holder[row] = (req, block_ids, epoch)
        return row

    def _claim(self) -> int:
        if not self._free:
            self._reclaim()
        return self._free.pop()

    def _reclaim(self) -> None:
        """Free the rows of requests no longer running (finished, aborted or preempted)."""
        for rid, row in list(self._row.items()):
            req = self._holder[row][0]
            if req.status != RUNNING or req.is_finished:
                del self._row[rid]
                self._holder[row] = None
                self.table[row, : self.lens[row]] = 0
                self.lens[row] = 0
                self._free.append(row)
        if not self._free:
            raise RuntimeError("more running requests than block-table rows")
