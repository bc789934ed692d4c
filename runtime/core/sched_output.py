"""SchedulerOutput: the plain data a step hands from the scheduler to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from pagoda.runtime.request import Request


class ScheduledRequest(msgspec.Struct, gc=False):
    """One per scheduled request per step: a msgspec Struct (built in C, ~6x cheaper than a
    slotted dataclass's Python `__init__`; untracked by the collector, it holds no cycle)."""

    request: Request
    num_new_tokens: int  # tokens computed this step, starting at request.num_computed_tokens
    block_ids: list[int]  # the request's whole block table after allocation


@dataclass
class SnapshotPlan:
    """A step's Mamba state snapshot copies (`core/state_snapshots.py`), by row of
    `SchedulerOutput.scheduled`: the states to restore into the rows' slots before the step, and
    the boundaries whose states to save (a position the row's chunk reaches)."""

    restores: list[tuple[int, int]] = field(default_factory=list)  # (row, entry)
    saves: list[tuple[int, int, int]] = field(default_factory=list)  # (row, boundary, entry)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]  # decodes (1 new token) first, then prefill chunks
    num_decodes: int
    num_batched_tokens: int
    preempted: list[Request] = field(default_factory=list)
    snapshots: SnapshotPlan | None = None  # a hybrid's, on steps that copy any

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
