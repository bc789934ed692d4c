"""The recurrent state of a hybrid model's Mamba layers (vLLM v1's Mamba state, in small).

Each Mamba layer keeps, per running sequence, a conv state [conv_dim, d_conv - 1] and an SSM
state [heads, head_dim, d_state] (`model_configs.MambaConfig`), in preallocated slot tensors of
``max_num_seqs`` slots (the scheduler never runs more sequences than that, so every running
sequence has one; their bytes are in the memory estimate, `state_bytes`). A sequence gets a slot
the first step it is scheduled in; the slot is zeroed whenever a sequence starts from its first
token (admitted, or readmitted after a preemption: recompute rebuilds the state, as it rebuilds
the KV cache). Slots of requests no longer running (finished, aborted or preempted) are taken
back when the free ones run out, as `block_table.BlockTables` takes back its rows.

Prefix caching is off for these models (`engine/recurrent.py`): a cached prefix's KV blocks
say nothing of the state after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.core.sched_output import ScheduledRequest
from pagoda.runtime.model import mamba_shard
from pagoda.runtime.model.mamba2 import MambaStep, Prefill
from pagoda.runtime.request import RUNNING, Request


@dataclass
class HostSlots:
    """A step's slots on the host, built with its inputs (`ModelRunner._prepare_inputs`)."""

    slots: np.ndarray  # int64 [B]
    fresh: np.ndarray  # int64 slots to zero before the step (sequences at their first token)
    query_lens: list[int]
    num_decodes: int


def state_bytes(mc: ModelConfig, dtype: torch.dtype, max_num_seqs: int, tp: int = 1) -> int:
    """The bytes of one rank's slots (0 for a model without Mamba layers)."""
    m = mamba_shard.local(mc.family.mamba, tp)
    return 0 if m is None else m.state_bytes(dtype, max_num_seqs)


class MambaState:
    def __init__(
        self, mc: ModelConfig, num_slots: int, dtype: torch.dtype, device, tp: int = 1
    ) -> None:
        """`tp`: the ranks the mixers are split over (this rank's heads and groups alone:
        `model/mamba_shard.py`)."""
        m = mamba_shard.local(mc.family.mamba, tp)
        self.m = m
        self.layers = [i for i, mamba in enumerate(m.layers) if mamba]
        self.states = {
            i: (
                torch.zeros(num_slots, m.conv_dim, m.d_conv - 1, dtype=dtype, device=device),
                torch.zeros(num_slots, m.n_heads, m.head_dim, m.d_state,
                            dtype=m.ssm_dtype(dtype), device=device),
            )
            for i in self.layers
        }  # fmt: skip
        self._slot: dict[str, int] = {}  # request id -> its slot
        self._holder: list[Request | None] = [None] * num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @classmethod
    def for_model(
        cls, mc: ModelConfig, num_slots: int, dtype, device, tp: int = 1
    ) -> MambaState | None:
        return None if mc.family.mamba is None else cls(mc, num_slots, dtype, device, tp)

    def layer_caches(self, kv_caches: list) -> list:
        """Every layer's entry of the step's caches: the attention layers' paged K and V
        (`kv_caches`, in layer order), nothing for the others (a Mamba layer's state is in
        the step's `MambaStep`)."""
        kv = iter(kv_caches)
        return [next(kv) if self.m.attention(i) else () for i in range(len(self.m.layers))]

    def prepare(self, scheduled: Sequence[ScheduledRequest], num_decodes: int) -> HostSlots:
        """The step's slots, claimed for sequences seen for the first time."""
        slots = np.empty(len(scheduled), dtype=np.int64)
        fresh = []
        for i, s in enumerate(scheduled):
            req = s.request
            slot = self._slot.get(req.request_id)
            if slot is None or self._holder[slot] is not req:  # new (or a reused id)
                slot = self._claim(req)
            if req.num_computed_tokens == 0:
                fresh.append(slot)
            slots[i] = slot
        lens = [s.num_new_tokens for s in scheduled]
        return HostSlots(slots, np.asarray(fresh, dtype=np.int64), lens, num_decodes)

    def device_step(self, host: HostSlots, to_device: Callable[[np.ndarray], torch.Tensor]):
        """The step's `MambaStep`, the slots of sequences at their first token zeroed."""
        if len(host.fresh):
            fresh = to_device(host.fresh)
            for conv, ssm in self.states.values():
                conv.index_fill_(0, fresh, 0)
                ssm.index_fill_(0, fresh, 0)
        nd, slots = host.num_decodes, host.slots.tolist()
        run = None
        if nd and slots[:nd] == list(range(slots[0], slots[0] + nd)):
            run = (slots[0], slots[0] + nd)
        on_device = to_device(host.slots)
        prefill = None
        if nd < len(slots):  # the prefill chunks, laid out [sequences, longest chunk]
            lens = np.asarray(host.query_lens[nd:], dtype=np.int64)
            n = int(lens.max())
            starts = np.repeat(np.arange(len(lens)) * n - np.cumsum(lens) + lens, lens)
            rows = starts + np.arange(int(lens.sum()))
            prefill = Prefill((len(lens), n), to_device(rows), to_device(lens), on_device[nd:])
        return MambaStep(on_device, nd, self.states, run, prefill)

    def _claim(self, req: Request) -> int:
        old = self._slot.pop(req.request_id, None)
        if old is not None:  # a finished request's id reused: its slot goes back first
            self._release(old)
        if not self._free:
            self._reclaim()
        slot = self._free.pop()
        self._slot[req.request_id] = slot
        self._holder[slot] = req
        return slot

    def _release(self, slot: int) -> None:
        self._holder[slot] = None
        self._free.append(slot)

    def _reclaim(self) -> None:
        """Take back the slots of requests no longer running (finished, aborted, preempted)."""
        for rid, slot in list(self._slot.items()):
            req = self._holder[slot]
            if req.status != RUNNING or req.is_finished:
                del self._slot[rid]
                self._release(slot)
        if not self._free:
            raise RuntimeError("more running sequences than Mamba state slots")

    @property
    def num_held(self) -> int:
        """Slots held by requests (tests: all back after the requests end)."""
        return sum(1 for r in self._holder if r is not None and r.status == RUNNING)
