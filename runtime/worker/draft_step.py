"""The runner's side of a draft model (`spec/draft_model.py`): its catch-up on a step's prompt
chunks that do not sample, and its drafts after a step's tokens are read back, both over the
block-table rows of the requests they serve (the draft's KV rows sit in the same blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pagoda.runtime.spec.draft_model import draft_batch, prefill_batch

if TYPE_CHECKING:
    from pagoda.runtime.core.sched_output import SchedulerOutput
    from pagoda.runtime.worker.model_runner import ModelRunner
    from pagoda.runtime.worker.outputs import LaunchedStep, ModelRunnerOutput
    from pagoda.runtime.worker.step_inputs import StepInputs


def drafts(runner: ModelRunner, step: LaunchedStep, result: ModelRunnerOutput):
    """The draft model's drafts for the step's sampling requests that take them, after the
    tokens the step gave them (`ModelRunnerOutput.drafts`); None when none does."""
    reqs, tails, rows = draft_batch(step, result)
    if not reqs:
        return None
    table, nblocks = _table_rows(runner, rows)
    out = runner.draft.propose(reqs, tails, table, nblocks, runner.to_device)
    if runner.clock is not None:
        runner.clock.mark("draft")
    return reqs, out


def prefill(runner: ModelRunner, out: SchedulerOutput, inp: StepInputs) -> None:
    """The draft's catch-up on the step's prompt chunks that do not sample (queued)."""
    reqs, ends, rows = prefill_batch(out, inp.sampling, inp.seq_lens, runner.block_tables.rows)
    if reqs:
        runner.draft.catch_up(reqs, ends, *_table_rows(runner, rows), runner.to_device)


def _table_rows(runner: ModelRunner, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block-table rows of the last gathered step: [B, their most blocks] and [B] counts."""
    tables = runner.block_tables
    nblocks = tables.lens[rows]
    return tables.table[rows, : max(int(nblocks.max()), 1)], nblocks
