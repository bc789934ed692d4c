"""Persistent block tables: every step's gather equals the table rebuilt from the block lists,
through growth, preemption (a new list from the start), finished requests and reclaimed rows."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pagoda.runtime.core.sched_output import ScheduledRequest
from pagoda.runtime.request import Request, RequestStatus
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.worker.block_table import BlockTables


def rebuilt(lists: list[list[int]]) -> np.ndarray:
    table = np.zeros((len(lists), max(max(len(b) for b in lists), 1)), dtype=np.int32)
    for i, b in enumerate(lists):
        table[i, : len(b)] = b
    return table


def running(rid: str) -> Request:
    req = Request(rid, [1, 2, 3], SamplingParams(max_tokens=4))
    req.status = RequestStatus.RUNNING
    return req


@pytest.mark.parametrize("seed", range(5))
def test_random_steps_match_the_rebuilt_table(seed):
    rng = random.Random(seed)
    tables = BlockTables(max_rows=8, max_blocks=40)
    live: dict[str, tuple[Request, list[int]]] = {}
    next_id, next_block = 0, 1
    for _ in range(300):
        if len(live) < 4 and rng.random() < 0.5:  # admit
            req = running(f"r{next_id}")
            next_id += 1
            live[req.request_id] = (req, [])
        for rid, (req, blocks) in list(live.items()):
            roll = rng.random()
            if roll < 0.05:  # finishes: its row is reclaimed later
                req.status = RequestStatus.FINISHED_STOPPED
                del live[rid]
            elif roll < 0.1:  # preempted, then running again on fresh blocks
                req.num_preemptions += 1
                live[rid] = (req, [])
            elif roll < 0.6 and len(blocks) < 40:  # a new list object, one block longer
                live[rid] = (req, [*blocks, next_block])
                next_block += 1
        picked = [v for v in live.values() if rng.random() < 0.8]
        if not picked:
            continue
        scheduled = [ScheduledRequest(req, 1, blocks) for req, blocks in picked]
        np.testing.assert_array_equal(tables.gather(scheduled), rebuilt([b for _, b in picked]))


def test_rows_run_out_only_with_too_many_running_requests():
    tables = BlockTables(max_rows=2, max_blocks=4)
    a, b, c = running("a"), running("b"), running("c")
    tables.gather([ScheduledRequest(a, 1, [1]), ScheduledRequest(b, 1, [2])])
    with pytest.raises(RuntimeError, match="rows"):
        tables.gather([ScheduledRequest(c, 1, [3])])
    a.status = RequestStatus.FINISHED_LENGTH  # frees a row for c
    got = tables.gather([ScheduledRequest(c, 1, [3, 4]), ScheduledRequest(b, 1, [2])])
    np.testing.assert_array_equal(got, [[3, 4], [2, 0]])
    with pytest.raises(ValueError, match="blocks exceed"):
        tables.gather([ScheduledRequest(b, 1, [1, 2, 3, 4, 5])])


def test_a_reused_request_id_takes_over_its_finished_holders_row():
    tables = BlockTables(max_rows=2, max_blocks=4)
    first = running("a")
    tables.gather([ScheduledRequest(first, 1, [1, 2, 3])])
    first.status = RequestStatus.FINISHED_STOPPED
    again = running("a")  # a new request under the same id: no row may be orphaned
    np.testing.assert_array_equal(tables.gather([ScheduledRequest(again, 1, [7])]), [[7]])
    got = tables.gather([ScheduledRequest(again, 1, [7]), ScheduledRequest(running("b"), 1, [8])])
    np.testing.assert_array_equal(got, [[7], [8]])
