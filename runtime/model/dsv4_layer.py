"""DeepSeek-V4's attention layer stepped over a ragged batch against its paged cache (the design:
docs/runtime.md, "DeepSeek-V4 in the engine"): the projections and rotaries of
`dsv4_attention`, each token's rotated KV row written into the layer's paged rows, the
compressors stepped through their open-window slots (`dsv4_compressor.step_entries`), the
closing windows' entries rotated and written into the per-block entry tables (`dsv4_entries`),
then `dsv4_paged`'s attention, the output's rotary slice rotated back and the grouped output
projection. Not served yet: the engine's model class (runner allocation of the entry tables and
slots, `Step` metadata) is the next step; here the caller hands the step's layout (`Batch`) and
the layer's state (`Dsv4Cache`).

Weights by transformers' module names under ``self_attn.`` (`dsv4_config.canonical`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from pagoda.runtime.attention.base import AttentionMetadata
from pagoda.runtime.model import dsv4_entries as E
from pagoda.runtime.model import dsv4_paged as P
from pagoda.runtime.model.dsv4_attention import grouped_projection, rms, unrotate
from pagoda.runtime.model.dsv4_compressor import (
    rotate_trailing,
    slot_start,
    step_entries,
    step_widths,
)
from pagoda.runtime.model.dsv4_config import CSA, SLIDING, Dsv4Config, rotary


@dataclass(frozen=True)
class Batch:
    """One step's layout: B sequences, T tokens (each sequence's tokens contiguous, in order)."""

    block_tables: torch.Tensor  # [B, blocks]
    seq: torch.Tensor  # [T] each token's sequence
    pos: torch.Tensor  # [T] its position
    done: torch.Tensor  # [B] tokens cached before the step
    count: torch.Tensor  # [B] the step's tokens
    block_size: int
    # bool [B]: sequences whose first `done` tokens (whole blocks) come from the prefix cache
    # and whose slots start from their last block's Ca tail (CSA); None: none
    restored: torch.Tensor | None = None
    # the host's (done, count) int64 [B] each: the step's sizes read without a device sync
    # (`sizes`); None: read from the device tensors
    host: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_meta(cls, meta: AttentionMetadata, positions: torch.Tensor) -> Batch:
        """The engine step's layout (its attention metadata and token positions)."""
        starts = meta.query_start_loc.long()
        count = starts[1:] - starts[:-1]
        seq = torch.repeat_interleave(torch.arange(meta.num_seqs, device=count.device), count,
                                      output_size=positions.shape[0])  # fmt: skip
        done = meta.seq_lens.long() - count
        q = np.asarray(meta.query_lens_host, dtype=np.int64)
        host = (np.asarray(meta.seq_lens_host, dtype=np.int64) - q, q)
        return cls(meta.block_tables, seq, positions.long(), done, count, meta.block_size,
                   host=host)  # fmt: skip

    def sizes(self, rate: int, overlap: bool) -> dict | None:
        """A compressor's sizes this step from the host's lengths (None without them):
        `step_widths`', the most entries a sequence holds after it, the most block ends it
        crosses."""
        if self.host is None:
            return None
        done, q = self.host
        bs = self.block_size
        return {
            "widths": step_widths(done, q, rate, overlap),
            "entries": int(((done + q) // rate).max()),
            "tails": int(((done + q) // bs - done // bs).max()),
        }


@dataclass
class Dsv4Cache:
    """One layer's state: its paged rows [slots, D]; per compressor (``"kv"``, CSA's
    ``"index"``) the entry table [blocks, block_size / rate, width], CSA's Ca tails
    [blocks, rate, 2 C] (`dsv4_entries.write_tails`) and the B sequences' open-window slots
    (kv, gate) [B, S, C]."""

    rows: torch.Tensor
    entries: dict[str, torch.Tensor] = field(default_factory=dict)
    tails: dict[str, torch.Tensor] = field(default_factory=dict)
    slots: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _span(slot: torch.Tensor, new: torch.Tensor, s_len: torch.Tensor) -> torch.Tensor:
    """Each sequence's slot rows (its first ``s_len``) then the step's rows [B, S + Q, C]."""
    b, q = new.shape[0], new.shape[1]
    j = torch.arange(slot.shape[1] + q, device=new.device)[None, :].expand(b, -1)
    c = new.shape[-1]
    from_slot = j < s_len[:, None]
    n = new.gather(1, (j - s_len[:, None]).clamp(0, q - 1)[..., None].expand(-1, -1, c))
    if slot.shape[1] == 0:
        return n
    a = slot.gather(1, j.clamp(max=slot.shape[1] - 1)[..., None].expand(-1, -1, c))
    return torch.where(from_slot[..., None], a, n)


class Dsv4Attention:
    """Layer ``index`` of `c` (module docstring)."""

    def __init__(
        self,
        c: Dsv4Config,
        index: int,
        w: Mapping[str, torch.Tensor],
        reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """``w`` may hold a tensor-parallel rank's query heads, sinks and output groups
        (`dsv4_shard`): the heads and groups it computes are read from their shapes, its
        ``o_b_proj`` product summed over the ranks by ``reduce``."""
        self.c, self.w, self.kind = c, w, c.layer_types[index]
        self.rate = c.compress_rates[index]
        self.rope = c.main_rope if self.kind == SLIDING else c.compress_rope
        self.heads = w["sinks"].shape[0]
        self.groups = w["o_a_proj.weight"].shape[0] // c.o_lora_rank
        self.reduce = reduce

    def _table(self, pos: torch.Tensor, rope=None):
        cos, sin = rotary(rope or self.rope, self.c.rope_dim, pos)
        return cos, sin

    def _compress(self, prefix: str, name: str, x: torch.Tensor, b: Batch, cache: Dsv4Cache):
        """Step one compressor; write its closing windows' rotated entries; read the sequences'
        entries back [B, E, width]."""
        w, rate, overlap = self.w, self.rate, self.kind == CSA
        kv, gate = (
            F.linear(x, w[prefix + "kv_proj.weight"]),
            F.linear(x, w[prefix + "gate_proj.weight"]),
        )
        sizes = b.sizes(rate, overlap)
        width = max(int(b.count.max()) if b.host is None else int(b.host[1].max()), 1)
        at = b.pos - b.done[b.seq]  # each token's place in its sequence's step
        new_kv = kv.new_zeros(b.count.shape[0], width, kv.shape[-1])
        new_gate = torch.zeros_like(new_kv)
        new_kv[b.seq, at], new_gate[b.seq, at] = kv, gate
        c = kv.shape[-1]
        slot_kv, slot_gate = cache.slots.get(name, (kv.new_zeros(len(b.count), 0, c),) * 2)
        tails = cache.tails.get(name)
        most = None if sizes is None else sizes["tails"]
        if overlap and b.restored is not None:  # a prefix-cache hit
            # the block it restores from may be one another sequence fills in this very step
            # (the KV manager shares the blocks a step schedules): those tails first
            unrestored = torch.where(b.restored, 0, b.count)
            self._write_tails(tails, b, slot_kv, slot_gate, new_kv, new_gate, unrestored, most)
            slot_kv, slot_gate = self._restore(tails, b, slot_kv, slot_gate)
        norm = w[prefix + "kv_norm.weight"]
        entries, first, keep, *slot = step_entries(
            slot_kv, slot_gate, new_kv, new_gate, b.done, b.count, w[prefix + "position_bias"],
            norm, self.c.rms_norm_eps, rate, overlap, None if sizes is None else sizes["widths"],
        )  # fmt: skip
        cache.slots[name] = tuple(slot)
        if overlap:  # each block the step fills keeps its last window for a later prefix hit
            self._write_tails(tails, b, slot_kv, slot_gate, new_kv, new_gate, b.count, most)
        at_w = (first[:, None] + torch.arange(entries.shape[1], device=x.device)) * rate
        cos, sin = self._table(at_w, self.c.compress_rope)
        entries = rotate_trailing(entries, cos, sin)
        E.write_entries(cache.entries[name], b.block_tables, first, entries, keep, rate)
        got, _ = E.read_entries(cache.entries[name], b.block_tables, (b.done + b.count) // rate,
                                rate, None if sizes is None else sizes["entries"])  # fmt: skip
        return got

    def _write_tails(self, tails, b: Batch, slot_kv, slot_gate, new_kv, new_gate, count, most):
        """CSA: the Ca tail of every block the sequences' ``count`` step tokens fill
        (`dsv4_entries.write_block_tails` over each slot's rows, then the step's)."""
        start = slot_start(b.done, self.rate, True)
        span = [
            _span(sl, nw, b.done - start) for sl, nw in ((slot_kv, new_kv), (slot_gate, new_gate))
        ]
        E.write_block_tails(tails, b.block_tables, start, *span, b.done, count, b.block_size, most)

    def _restore(self, tails, b: Batch, slot_kv, slot_gate):
        """The restored sequences' slots: their last cached block's Ca tail (`rate` rows)."""
        rate, n = self.rate, max(slot_kv.shape[1], self.rate)
        pad = (0, 0, 0, n - slot_kv.shape[1])
        slot_kv, slot_gate = F.pad(slot_kv, pad), F.pad(slot_gate, pad)
        r = b.restored
        tail_kv, tail_gate = E.restore_slot(tails, b.block_tables[r], b.done[r], b.block_size)
        slot_kv[r, :rate], slot_gate[r, :rate] = (
            tail_kv.to(slot_kv.dtype),
            tail_gate.to(slot_kv.dtype),
        )
        return slot_kv, slot_gate

    def __call__(self, x: torch.Tensor, b: Batch, cache: Dsv4Cache) -> torch.Tensor:
        """The layer's attention output [T, hidden] for the step's normed inputs ``x``."""
        c, w, t = self.c, self.w, x.shape[0]
        eps, heads, d = c.rms_norm_eps, self.heads, c.head_dim
        cos, sin = self._table(b.pos)
        q_res = rms(F.linear(x, w["q_a_proj.weight"]), eps, w["q_a_norm.weight"])
        q = rms(F.linear(q_res, w["q_b_proj.weight"]).view(t, heads, d), eps)
        q = rotate_trailing(q, cos[:, None], sin[:, None])
        row = rotate_trailing(
            rms(F.linear(x, w["kv_proj.weight"]), eps, w["kv_norm.weight"]), cos, sin
        )
        bs = b.block_size
        slots = (
            b.block_tables[b.seq].gather(1, (b.pos // bs)[:, None])[:, 0].long() * bs + b.pos % bs
        )
        cache.rows.index_copy_(0, slots, row.to(cache.rows.dtype))
        win, kept = P.window_slots(b.block_tables, b.seq, b.pos, c.sliding_window, bs)
        entries = picked = None
        if self.kind != SLIDING:
            entries = self._compress("compressor.", "kv", x, b, cache)
            allowed = P.ready(b.pos, entries.shape[1], self.rate)
            if self.kind == CSA:
                ix = "compressor.indexer."
                keys = self._compress(ix, "index", x, b, cache)
                qi = F.linear(q_res, w[ix + "q_b_proj.weight"]).view(t, c.index_n_heads, -1)
                ci, si = self._table(b.pos, c.compress_rope)
                qi = rotate_trailing(qi, ci[:, None], si[:, None])
                scores = P.index_scores(
                    qi, keys, F.linear(x, w[ix + "scorer.weights_proj.weight"]), b.seq
                )
                picked = P.pick(scores, allowed, c.index_topk)
            else:
                picked = P.every(allowed)
        sinks = w["sinks"].float()
        out = P.attend(q, cache.rows, win, kept, entries, picked, b.seq, sinks, d**-0.5)
        out = unrotate(out, cos[:, None], sin[:, None]).to(x.dtype)
        g = self.groups
        grouped = grouped_projection(out.reshape(t, g, -1), w["o_a_proj.weight"], g)
        out = F.linear(grouped.flatten(1), w["o_b_proj.weight"])
        return out if self.reduce is None else self.reduce(out)
