"""Admission on its own: the queue's bounds, the refusals, and the bulk prompts' round robin
(no engine, no event loop; the engine-level behaviour is tests/server/test_async_engine.py's)."""

from __future__ import annotations

import pytest
from pagoda.runtime.engine.admission import Admission, QueueFullError, reserved
from pagoda.runtime.sampling.params import ParamError, SamplingParams


def test_reserve_is_an_eighth_at_least_one_never_all():
    assert [reserved(s) for s in (1, 2, 8, 16, 512)] == [0, 1, 1, 2, 64]


def test_limits_and_refusals():
    a = Admission(max_queue_len=16, max_seqs_per_request=100, retry_after=3)
    assert (a.max_seqs_per_request, a.bulk_queue, a.bulk_slots) == (8, 14, None)
    assert not a.paces_bulk
    with pytest.raises(ParamError) as e:
        a.check_size(1, SamplingParams(n=9))
    assert e.value.field == "n"
    a.admit("b-0", 8, bulk=True)
    a.admit("b-1", 6, bulk=True)
    with pytest.raises(QueueFullError, match="may fill 14") as full:
        a.check_room(1, bulk=True)
    assert full.value.retry_after == 3
    a.check_room(1, bulk=False)  # the reserve
    a.admit("s", 1, bulk=False)
    assert a.num_queued == 15
    for rid in ("b-0", "b-1", "s", "s"):  # unqueue twice is a no-op
        a.unqueue(rid)
    assert a.num_queued == 0


def test_bulk_prompts_take_turns_within_the_share_of_slots():
    a = Admission(max_queue_len=512, max_num_seqs=8)  # 7 bulk slots
    p, p2 = SamplingParams(), SamplingParams(n=2)
    a.hold_back("x", [(f"x-{i}", [1], p) for i in range(5)])
    a.hold_back("y", [(f"y-{i}", [2], p2) for i in range(3)])
    fed = [rid for rid, _, _ in a.next_for_core()]
    assert fed == ["x-0", "y-0", "x-1", "y-1", "x-2"]  # 1+2+1+2+1 = 7 slots
    assert a.bulk_in_core == 7 and a.num_waiting == 3
    assert a.next_for_core() == []  # y-2 (n=2) is next and does not fit
    assert a.release("y-0", 1) and a.bulk_in_core == 6
    assert not a.release("nobody")
    assert a.next_for_core() == []
    assert a.release("y-0") and a.bulk_in_core == 5  # its other sequence
    assert [r for r, _, _ in a.next_for_core()] == ["y-2"]
    assert a.drop_waiting("x-4") and not a.drop_waiting("x-4")
    for rid in ("x-0", "x-1", "y-1", "x-2", "y-2"):
        a.release(rid)
    assert a.bulk_in_core == 0
    assert [r for r, _, _ in a.next_for_core()] == ["x-3"]
    a.clear_waiting()
    assert not a.has_waiting


def test_a_prompt_wider_than_the_share_still_runs_alone():
    a = Admission(max_num_seqs=4)  # 3 bulk slots
    a.hold_back("w", [("w-0", [1], SamplingParams(n=5)), ("w-1", [1], SamplingParams(n=5))])
    assert [r for r, _, _ in a.next_for_core()] == ["w-0"]
    a.release("w-0")
    assert [r for r, _, _ in a.next_for_core()] == ["w-1"]
