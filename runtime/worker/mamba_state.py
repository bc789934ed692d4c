"""The recurrent state of a hybrid model's Mamba layers (vLLM v1's Mamba state, in small).

Each Mamba layer keeps, per running sequence, a conv state [conv_dim, d_conv - 1] and an SSM
state [heads, head_dim, d_state] (`recurrent_configs.MambaConfig`; an LFM2 short conv layer a conv
state alone, its SSM slots empty: `MambaConfig.ssm_shape`), in preallocated slot tensors of
``max_num_seqs`` slots (the scheduler never runs more sequences than that, so every running
sequence has one; their bytes are in the memory estimate, `state_bytes`). The slots hang off the
persistent block-table rows (`block_table.BlockTables`, one row per request while it runs): a
column of each row's slot, written only when a row without one is scheduled (a request joining)
or when slots are taken back, so a step reads its slots with one indexing operation, no loop
over its requests. The slot is zeroed whenever a sequence starts from its first token
(admitted, or readmitted after a preemption: recompute rebuilds the state, as it rebuilds the KV
cache; a row changes hands only then). Slots of rows whose request no longer runs (finished,
aborted or preempted) are taken back when the free ones run out.

With tensor parallelism each rank's slots hold its heads and groups (`model/mamba_shard.py`);
rank 0 alone keeps the slot column (`prepare`) and sends each step's `HostSlots` to the others
(`worker/step_channel.py`), which build the same `MambaStep` from them (`device_step`).

Prefix caching (`core/state_snapshots.py`): a pool of snapshot entries beside the slots, one
state of every Mamba layer each, preallocated (`allocate_snapshots`) from the KV cache's budget.
A step's `SnapshotPlan` becomes index copies, a few per layer whatever the number of sequences:
a hit's entry copied into its slot before the forward (`device_step`), and the boundaries the
step's chunks reach copied out as each layer computes them (`model/mamba2.py`: the state left
in a slot at a chunk's end; inside a prefill chunk, the state at the boundary and the conv
inputs before it: for the chunked rules (Mamba2, Gated DeltaNet, KDA) at one of the scan's chunk
boundaries, for Mamba-1's position-by-position scan and LFM2's short conv at any block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.config import ModelConfig
from pagoda.runtime.core.sched_output import SnapshotPlan
from pagoda.runtime.model import mamba_shard
from pagoda.runtime.model.mamba2 import MambaStep, Prefill, ScanGroup
from pagoda.runtime.model.ssd import pack
from pagoda.runtime.request import RUNNING, Request
from pagoda.runtime.worker.block_table import BlockTables


@dataclass
class HostSlots:
    """A step's slots on the host, built with its inputs (`worker/prepare_inputs.py`)."""

    slots: np.ndarray  # int64 [B]
    fresh: np.ndarray  # int64 slots to zero before the step (sequences at their first token)
    query_lens: list[int]
    num_decodes: int
    # prefix caching (`SnapshotPlan`): int64 [2, n] (slots, entries) to restore before the step,
    # and to save after it (boundaries at a chunk's end); boundaries inside prefill chunks as
    # int64 [3, n] (prefill row, offset in its chunk, entry)
    restore: np.ndarray | None = None
    save_end: np.ndarray | None = None
    save_mid: np.ndarray | None = None


def state_bytes(mc: ModelConfig, dtype: torch.dtype, max_num_seqs: int, tp: int = 1) -> int:
    """The bytes of one rank's slots (0 for a model without Mamba layers)."""
    m = mamba_shard.local(mc.family.mamba, tp)
    return 0 if m is None else m.state_bytes(dtype, max_num_seqs)


class MambaState:
    def __init__(
        self,
        mc: ModelConfig,
        num_slots: int,
        dtype: torch.dtype,
        device,
        rows: BlockTables,
        tp: int = 1,
    ) -> None:
        """`rows`: the runner's block tables (the slot column hangs off their rows); `tp`: the
        ranks the mixers are split over (this rank's heads and groups alone:
        `model/mamba_shard.py`)."""
        m = mamba_shard.local(mc.family.mamba, tp)
        self.m = m
        self.layers = [i for i, mamba in enumerate(m.layers) if mamba]
        self.states = {
            i: (
                torch.zeros(num_slots, m.conv_state_rows, m.d_conv - 1, dtype=dtype, device=device),
                torch.zeros(num_slots, *m.ssm_shape, dtype=m.ssm_dtype(dtype), device=device),
            )
            for i in self.layers
        }  # fmt: skip
        # the persistent slot column: each block-table row's slot (-1: none), written only when
        # a row gets a slot or gives it back; a step reads its rows' slots in one indexing
        self.snaps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # prefix caching's
        self.num_snapshots = 0
        self.rows = rows
        self.slot_of_row = np.full(len(rows.lens), -1, dtype=np.int64)
        self._row_of_slot = np.full(num_slots, -1, dtype=np.int64)
        self._free = list(range(num_slots - 1, -1, -1))

    @classmethod
    def for_model(
        cls, mc: ModelConfig, num_slots: int, dtype, device, rows: BlockTables, tp: int = 1
    ) -> MambaState | None:
        if mc.family.mamba is None:
            return None
        return cls(mc, num_slots, dtype, device, rows, tp)

    @property
    def snapshot_bytes(self) -> int:
        """The bytes of one snapshot entry: one slot's states (every Mamba layer's)."""
        return self.m.state_bytes(next(iter(self.states.values()))[0].dtype, 1)

    def allocate_snapshots(self, num: int) -> None:
        """The prefix cache's `num` snapshot entries (`core/state_snapshots.py`), shaped and
        typed as the slots."""
        self.num_snapshots = num
        self.snaps = {i: (conv.new_zeros(num, *conv.shape[1:]), ssm.new_zeros(num, *ssm.shape[1:]))
                      for i, (conv, ssm) in self.states.items()}  # fmt: skip

    def layer_caches(self, kv_caches: list) -> list:
        """Every layer's entry of the step's caches: the attention layers' paged K and V
        (`kv_caches`, in layer order), nothing for the others (a Mamba layer's state is in
        the step's `MambaStep`)."""
        kv = iter(kv_caches)
        return [next(kv) if self.m.attention(i) else () for i in range(len(self.m.layers))]

    def prepare(
        self,
        rows: np.ndarray,
        starts: np.ndarray,
        query_lens: np.ndarray,
        num_decodes: int,
        plan: SnapshotPlan | None = None,
    ) -> HostSlots:
        """The step's slots: its block-table rows' (`BlockTables.gather`), a slot claimed for
        a row that has none (a request joining); the slots of sequences at their first token
        to be zeroed. A request keeps its row while it runs; a row changes hands only once its
        request stopped running, and the next one starts from its first token: zeroed (or,
        after a prefix hit, `plan`'s snapshot restored into it)."""
        slots = self.slot_of_row[rows]
        for i in np.flatnonzero(slots < 0).tolist():  # only the rows without a slot
            slots[i] = self._claim(int(rows[i]))
        fresh = slots[starts == 0]
        host = HostSlots(slots, fresh, query_lens.tolist(), num_decodes)
        if plan is not None:
            if plan.restores:
                r, entry = np.array(plan.restores, dtype=np.int64).T
                host.restore = np.stack([slots[r], entry])
            if plan.saves:
                r, pos, entry = np.array(plan.saves, dtype=np.int64).T
                off = pos - starts[r]
                end = off == query_lens[r]
                if end.any():
                    host.save_end = np.stack([slots[r[end]], entry[end]])
                if not end.all():
                    mid = ~end
                    host.save_mid = np.stack([r[mid] - num_decodes, off[mid], entry[mid]])
        return host

    def device_step(self, host: HostSlots, to_device: Callable[[np.ndarray], torch.Tensor]):
        """The step's `MambaStep`, the slots of sequences at their first token zeroed, those
        of prefix hits restored from their snapshots."""
        if len(host.fresh):
            fresh = to_device(host.fresh)
            for conv, ssm in self.states.values():
                conv.index_fill_(0, fresh, 0)
                ssm.index_fill_(0, fresh, 0)
        if host.restore is not None:
            self.restore(*to_device(host.restore))
        save_end = None if host.save_end is None else tuple(to_device(host.save_end))
        nd, slots = host.num_decodes, host.slots.tolist()
        snaps = self.snaps if host.save_end is not None or host.save_mid is not None else None
        run = None
        if nd and slots[:nd] == list(range(slots[0], slots[0] + nd)):
            run = (slots[0], slots[0] + nd)
        on_device = to_device(host.slots)
        prefill = None
        if nd < len(slots):  # the prefill chunks, in the scan's packed layout
            m = self.m
            p = pack(host.query_lens[nd:], m.chunk_size, m.d_conv)
            parts = [host.slots[nd:][p.order], p.conv_rows, p.conv_out, p.state_rows, p.end_rows]
            for g in p.groups:
                parts += [g.tokens, g.rows, g.chunk_of, g.in_chunk]
            mid, runs = None, None
            if host.save_mid is not None:
                mid, runs = _mid_saves(host, p, m.d_conv)
                parts += [*mid, host.save_mid.reshape(-1)]
            # one copy to the device, split there into views
            idx = to_device(np.concatenate(parts)).split([len(a) for a in parts])
            slots = idx[0]
            groups = [ScanGroup(g.counts, g.num_chunks, slots[slice(*g.seqs)], *idx[5 + 4 * i : 9 + 4 * i])
                      for i, g in enumerate(p.groups)]  # fmt: skip
            prefill = Prefill(p.conv_len, *idx[:5], groups)
            if mid is not None:  # the conv rows and entries, then each group's chunks, entries
                k = 5 + 4 * len(groups)
                prefill.snap_conv_rows, prefill.snap_conv_entries = idx[k : k + 2]
                for i, g in enumerate(groups):
                    g.snap_chunks, g.snap_entries = idx[k + 2 + 2 * i : k + 4 + 2 * i]
                    g.snap_runs = runs[i]
                prefill.snap_mid = idx[-1].view(3, -1)
        return MambaStep(on_device, nd, self.states, run, prefill, snaps, save_end)

    def restore(self, slots: torch.Tensor, entries: torch.Tensor) -> None:
        """Copy snapshot `entries` into state `slots` (every layer's; a prefix hit's)."""
        for i, (conv, ssm) in self.states.items():
            snap_conv, snap_ssm = self.snaps[i]
            conv.index_copy_(0, slots, snap_conv.index_select(0, entries))
            ssm.index_copy_(0, slots, snap_ssm.index_select(0, entries))

    def _claim(self, row: int) -> int:
        if not self._free:
            self._reclaim()
        slot = self._free.pop()
        self.slot_of_row[row] = slot
        self._row_of_slot[slot] = row
        return slot

    def _reclaim(self) -> None:
        """Take back the slots of rows whose request no longer runs (finished, aborted,
        preempted: a preempted one claims a slot again when it restarts)."""
        for slot, row in enumerate(self._row_of_slot.tolist()):
            if row >= 0 and not _running(self.rows.request(row)):
                self.slot_of_row[row] = self._row_of_slot[slot] = -1
                self._free.append(slot)
        if not self._free:
            raise RuntimeError("more running sequences than Mamba state slots")

    @property
    def num_held(self) -> int:
        """Slots held by running requests (tests: all back after the requests end)."""
        return sum(_running(self.rows.request(r)) for r in self._row_of_slot.tolist() if r >= 0)


def _mid_saves(
    host: HostSlots, p, d_conv: int
) -> tuple[list[np.ndarray], list[dict[int, tuple[int, int]]]]:
    """The host arrays of the snapshots at boundaries inside prefill chunks (for the chunked
    rules each on one of the scan's chunk boundaries: `core/state_snapshots.py`; for Mamba-1
    and the short conv any block's): the conv rows before each boundary in
    the conv segments (`ssd.pack`) and its entry, then per scan group the packed chunk the
    boundary starts (whose start state is the snapshot's) and its entry, sorted by chunk; and
    per group its runs (`mamba2.ScanGroup.snap_runs`: the chunk positions the boundaries fall
    in, for a scan that walks them one by one, Mamba-1's)."""
    rows, off, entry = host.save_mid
    lens = np.asarray(host.query_lens[host.num_decodes :], dtype=np.int64)
    token = (np.cumsum(lens) - lens)[rows] + off  # the boundary's first token, in the chunk
    k = d_conv - 1
    out = [(p.conv_out[token][:, None] + np.arange(k)).reshape(-1), entry]
    runs = []
    rank = np.empty_like(p.order)
    rank[p.order] = np.arange(len(p.order))
    for g in p.groups:
        here = (rank[rows] >= g.seqs[0]) & (rank[rows] < g.seqs[1])
        chunks = g.chunk_of[np.searchsorted(g.tokens, token[here])]
        by = np.argsort(chunks, kind="stable")
        chunks = chunks[by]
        out += [chunks, entry[here][by]]
        ends = np.cumsum(g.counts)  # each chunk position's packed chunks end here
        at = np.searchsorted(ends, chunks, side="right")  # each boundary's chunk position
        pos, first = np.unique(at, return_index=True)
        last = [*first[1:].tolist(), len(chunks)]
        runs.append({int(ends[q] - g.counts[q]): (int(a), b)
                     for q, a, b in zip(pos.tolist(), first, last)})  # fmt: skip
    return out, runs


def _running(req: Request | None) -> bool:
    return req is not None and req.status == RUNNING and not req.is_finished
