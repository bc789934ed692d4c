"""The pooling runner's device side: which rows of a step the model hands back (final-norm
hidden states, the LM head not run), and one float32 vector per request whose prompt ends in
the step.

Every request of a pooling engine is a prompt, prefilled (in one chunk or several) and then
finished. LAST reads the last prompt row (in the step that ends the prompt); CLS the row at
position 0 (kept from its step until the prompt ends); MEAN sums every prompt row into the
request's accumulator across chunks and divides by the prompt's length at its end. The
accumulators are a preallocated [block-table rows, hidden] float32 buffer indexed by each
request's block-table row (`BlockTables.rows`, stable while the request runs); a request whose
step starts at position 0 (a first chunk, or a preempted one computed again) starts its row
afresh. Everything is batched: one index_select / index_copy / index_add per step. A sequence
classifier's pooled rows then go through its head (`model/classifier_head.py`) to its labels'
probabilities.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.model.classifier_head import activate
from pagoda.runtime.pooler_config import PoolerConfig
from pagoda.runtime.worker.outputs import LaunchedStep
from pagoda.runtime.worker.readback import pinned_copies
from pagoda.runtime.worker.step_inputs import StepInputs

if TYPE_CHECKING:
    from pagoda.runtime.core.sched_output import SchedulerOutput
    from pagoda.runtime.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


def pool_rows(pooling_type: str, inp: StepInputs) -> np.ndarray:
    """int64: the rows of the step's token batch whose hidden states the pooler reads (the
    same on every rank of a tensor-parallel group: it reads what rank 0 sends)."""
    if pooling_type == "LAST":
        return inp.cu[1:][inp.sampling] - 1
    if pooling_type == "CLS":
        return np.flatnonzero(inp.positions == 0)
    return np.arange(len(inp.positions), dtype=np.int64)  # MEAN: every row


def execute_pooling(runner: ModelRunner, out: SchedulerOutput, inp: StepInputs) -> LaunchedStep:
    """The pooling runner's step: hidden states (no LM head) → the vectors of the prompts that
    end in it, queued on the device (read back by `worker/readback.py`)."""
    hidden = runner.forward(inp, None)
    reqs = [out.scheduled[i].request for i in inp.sampling]
    vectors = runner.pooler.pool(hidden, inp, runner.block_tables.rows, runner.to_device)
    step = LaunchedStep(reqs, None, pooled=vectors)
    if vectors is not None and runner.device.type == "cuda":
        step.pooled_host = pinned_copies((vectors,))[0]
        step.ready = torch.cuda.Event()
        step.ready.record()
    if runner.clock is not None:
        runner.clock.mark("forward")
    return step


class Pooler:
    @classmethod
    def for_runner(cls, config, hidden_size: int, tp, device: torch.device, head=None
                   ) -> tuple[str | None, Pooler | None]:  # fmt: skip
        """(the pooling type, the pooler) of an `EngineConfig`'s runner: (None, None) when it
        generates; the pooler on rank 0 only (the other ranks of a group hand back rows).
        `head`: a sequence classifier's (`model/classifier_head.py`), run on the pooled rows."""
        pc = config.pooler_config if config.runner == "pooling" else None
        if pc is None:
            return None, None
        if tp is not None and tp.rank != 0:
            return pc.pooling_type, None
        log.info("pooling runner: %s pooling%s%s; no LM head, prefix caching off",
                 pc.pooling_type, ", normalized" if pc.normalize else "",
                 f", {pc.dimensions} dimensions" if pc.dimensions else "")  # fmt: skip
        if pc.cross_encoder and head is None:
            raise ValueError("a sequence classifier's model read no classifier head")
        pooler = cls(pc, hidden_size, 2 * config.scheduler.max_num_seqs, device)
        pooler.head = head if pc.cross_encoder else None
        return pc.pooling_type, pooler

    def __init__(self, config: PoolerConfig, hidden_size: int, num_rows: int,
                 device: torch.device) -> None:  # fmt: skip
        self.type = config.pooling_type
        self.normalize = config.normalize
        self.dimensions = config.dimensions
        self.multi_label = config.multi_label
        self.head = None  # a classifier's: its pooled rows' logits, then probabilities
        self.device = device
        self.acc = None
        if self.type != "LAST":  # a request's sum (MEAN) or first row (CLS) across its chunks
            self.acc = torch.zeros(num_rows, hidden_size, dtype=torch.float32, device=device)

    def pool(self, hidden: torch.Tensor, inp: StepInputs, table_rows: np.ndarray,
             to_device) -> torch.Tensor | None:  # fmt: skip
        """float32 [len(inp.sampling), D] on the device: the vectors of the requests whose
        prompt ends this step (in `inp.sampling`'s order); None when none does. `hidden`: the
        model's rows `rows(inp)`; `table_rows`: each scheduled request's accumulator row."""
        done = np.asarray(inp.sampling, dtype=np.int64)
        h = hidden.float()
        if self.type == "LAST":
            out = h
        else:
            acc = self.acc
            starts = inp.positions[inp.cu[:-1]] if len(inp.positions) else inp.cu[:-1]
            seq = np.repeat(np.arange(len(inp.qlens)), inp.qlens)  # each row's request
            if self.type == "CLS":
                firsts = np.flatnonzero(inp.positions == 0)
                acc.index_copy_(0, to_device(table_rows[seq[firsts]]), h)
            else:
                fresh = table_rows[starts == 0]
                if len(fresh):
                    acc.index_fill_(0, to_device(fresh), 0.0)
                acc.index_add_(0, to_device(table_rows[seq]), h)
            if not len(done):
                return None
            out = acc.index_select(0, to_device(table_rows[done]))
            if self.type == "MEAN":
                lens = to_device(inp.seq_lens[done].astype(np.float32))
                out = out / lens.unsqueeze(1)
        if not len(done):
            return None
        if self.head is not None:
            return activate(self.head(out), self.multi_label)
        if self.dimensions is not None:  # Matryoshka: the leading components
            out = out[:, : self.dimensions]
        return F.normalize(out, dim=-1) if self.normalize else out
