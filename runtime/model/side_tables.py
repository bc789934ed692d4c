"""Tables some sparse-attention layers keep beside their KV cache (`SlotTable`, `PoolTable`), and
their bytes in the KV budget (`block_bytes`, as DeepSeek-V4's entries count in
`dsv4_engine.block_bytes`).

A table's rows are indexed by the KV cache's slots, so the KV manager's blocks carry them:
prefix hits, chunked prefill and preemption read the rows of the blocks they read the K/V rows
of. Each layer allocates its tables when it first sees a KV cache (a new cache, a new engine's,
gets new tables) with one spare row past them: padding's (a CUDA graph's slot -1) and, in a
pool table, every step token's that ends no pool.

- **token rows** (`SlotTable`, one a slot): MiniMax-M3's indexer keys (`minimax_m3.BlockIndexer`:
  a block's score is a max over its keys, nothing to pool ahead), Qwen4-Exp's raw QSA keys
  (`qwen4_qsa.QsaIndexer`), Kolibri 1.1's raw keys of the layers whose pools a pool layer picks
  from (`kolibri1.Kolibri11Layer`). GLM-5-Next keeps its indexer keys and gate scores in the
  latent row itself (`MlaConfig.cache_width`: counted as the KV rows are).
- **pool rows** (`PoolTable`): each finished pool's key (a sequence's positions cut into pools
  of ``size`` from its first token): Qwen4-Exp's block keys (mean, normed, rotated at the
  block's start), GLM-5-Next's k-pool keys (the gate-softmax mix), Kolibri 1.1's block means
  (NVFP4). A pool's row is written once, by the step whose token ends it (`PoolTable.close`
  over `ends`: the step's pools from their ``size`` slots through the block table, O(step
  tokens)), at its last token's slot // gcd(size, block_size) (no two pools share a row); the
  selection then reads the finished pools' rows (`PoolTable.gather`) in place of pooling the
  whole context's token rows every step.

Every table's bytes a KV block takes (``block_bytes``, from the config alone) are counted where
the KV rows are: the runner's `bytes_per_block` (the pool's blocks), the start-up estimate
(`server/memory.kv_bytes_per_token`) and `server/fit.py`. The spare rows (one a table) are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.cpu.host_memory import zeros

POOLS = "side_pools"  # `meta.aux`: {size: `Ends`} of the step


@dataclass(frozen=True)
class Spec:
    """One layer's tables: ``tokens`` values a slot (0: none), ``pooled`` values a pool of
    ``pool`` tokens (0: none)."""

    tokens: int = 0
    pool: int = 0
    pooled: int = 0

    def block_bytes(self, block_size: int, itemsize: int) -> int:
        n = block_size * self.tokens
        if self.pool:  # a row a gcd(pool, block) slots (`PoolTable`)
            n += block_size // math.gcd(self.pool, block_size) * self.pooled
        return n * itemsize


def specs(mc) -> list[Spec]:
    """Every layer's tables (module docstring), in the model's dtype; none for most models."""
    f = mc.family
    q = getattr(f, "qwen4", None)
    if q is not None and q.indexer_heads:  # every attention layer's QSA indexer
        d = q.indexer_dim
        return [Spec(d, q.indexer_ratio, d) for _ in mc.kv_layer_shapes]
    ix = getattr(f, "block_index", None)
    if ix is not None:  # MiniMax-M3's sparse layers
        return [Spec(ix.head_dim) for sparse in ix.layers if sparse]
    k = getattr(f, "kolibri11", None)
    if k is not None:  # the raw keys of the layers the pool layers pick from
        keepers = sorted({k.kv_source[i] for i, pool in enumerate(k.pool_layers) if pool})
        d = mc.head_dim
        return [Spec(d, k.compression, d) for _ in keepers]
    mla = getattr(f, "mla", None)
    ix = None if mla is None else mla.indexer
    if ix is not None and ix.kpool:  # GLM-5-Next's full indexed layers (keys in the rows)
        return [Spec(0, ix.kpool, ix.head_dim) for full in ix.full_layers if full]
    return []


def block_bytes(mc, dtype: torch.dtype, block_size: int) -> int:
    """Every table's bytes one KV block takes (over every layer)."""
    return sum(s.block_bytes(block_size, dtype.itemsize) for s in specs(mc))


def bytes_per_token(mc, dtype: torch.dtype, block_size: int) -> int:
    """`block_bytes` a token (rounded up): what the start-up estimates add per token."""
    return -(-block_bytes(mc, dtype, block_size) // block_size)


class SlotTable:
    """A layer's rows beside its KV cache, one a slot of ``width`` values (module docstring)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: torch.Tensor | None = None  # [slots + 1, width] (the last: the spare row)
        self._owner = 0  # the data pointer of the KV cache `rows` goes with

    def bind(self, cache: torch.Tensor, slots: int, dtype: torch.dtype) -> torch.Tensor:
        """The rows that go with the KV ``cache`` of ``slots`` slots (new ones for a new
        cache)."""
        if self.rows is None or self._owner != cache.data_ptr():
            self.rows = zeros((slots + 1, self.width), dtype, cache.device)  # (lazy pages)
            self._owner = cache.data_ptr()
        return self.rows

    def write(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """``values`` [T, width] at ``slots`` [T] (-1, padding: the spare row)."""
        spare = self.rows.shape[0] - 1
        at = torch.where(slots < 0, spare, slots)
        self.rows.index_copy_(0, at, values.to(self.rows.dtype))

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else self.rows.numel() * self.rows.element_size()

    @property
    def spare_bytes(self) -> int:
        return 0 if self.rows is None else self.rows.shape[1] * self.rows.element_size()


@dataclass
class Ends:
    """The pools a step's tokens may end (`ends`): row i, the pool ending at step token
    ``tok[i]`` (``end[i]``: it does), its ``size`` cache ``slots`` [N, size] and first position
    ``first`` [N]."""

    tok: torch.Tensor  # [N] step rows
    slots: torch.Tensor  # int64 [N, size]
    first: torch.Tensor  # int64 [N]
    end: torch.Tensor  # bool [N]


def ends(meta, size: int) -> Ends:
    """The pools of ``size`` positions the step's tokens end, once a step and size (`meta.aux`),
    their slots through the sequences' block tables. A step with prompt rows (never a CUDA
    graph's) lists those from the host's lengths: one row a pool, so a chunk pools its tokens
    once; a decode step (maybe a graph's: device tensors only) takes a row a token, the pool
    ending at it (clamped at the sequence's start), ``end`` where its position + 1 is a multiple
    of ``size`` (not padding: slot -1, length 0)."""
    done = meta.aux.setdefault(POOLS, {})
    if size not in done:
        eager = meta.query_lens_host and meta.num_decodes < meta.num_seqs
        done[size] = _host_ends(meta, size) if eager else _device_ends(meta, size)
    return done[size]


def _device_ends(meta, size: int) -> Ends:
    qsl = meta.query_start_loc
    tok = torch.arange(meta.slot_mapping.shape[0], device=qsl.device, dtype=qsl.dtype)
    seq = torch.searchsorted(qsl[1:], tok, right=True).clamp_(max=meta.block_tables.shape[0] - 1)
    pos = (meta.seq_lens[seq] - qsl[seq + 1] + tok).long()  # each token's position
    end = (meta.slot_mapping >= 0) & (pos >= size - 1) & ((pos + 1) % size == 0)
    slots, first = _pool_slots(meta, seq, pos, size)
    return Ends(tok.long(), slots, first, end)


def _host_ends(meta, size: int) -> Ends:
    qlens = np.asarray(meta.query_lens_host, dtype=np.int64)
    slens = np.asarray(meta.seq_lens_host, dtype=np.int64)
    starts, qstart = slens - qlens, np.concatenate([[0], np.cumsum(qlens)[:-1]])
    last = -(-(starts + 1) // size) * size - 1  # each sequence's first pool end at or past start
    counts = np.maximum(0, (slens - 1 - last) // size + 1)
    seq = np.repeat(np.arange(len(qlens)), counts)
    pos = last[seq] + size * (np.arange(len(seq)) - np.repeat(np.cumsum(counts) - counts, counts))
    dev = meta.block_tables.device
    seq_d, pos_d = _to(seq, dev), _to(pos, dev)
    slots, first = _pool_slots(meta, seq_d, pos_d, size)
    tok = _to(qstart[seq] + pos - starts[seq], dev)
    return Ends(tok, slots, first, torch.ones(len(seq), dtype=torch.bool, device=dev))


def _pool_slots(meta, seq: torch.Tensor, pos: torch.Tensor, size: int):
    """(slots [N, size], first [N]) of the pools ending at positions ``pos`` [N] of sequences
    ``seq`` [N] (positions before 0 clamped to 0)."""
    table, bs = meta.block_tables, meta.block_size
    first = pos - (size - 1)
    p = (first[:, None] + torch.arange(size, device=pos.device)).clamp_(min=0)
    cols = (p // bs).clamp_(max=table.shape[1] - 1)
    return table[seq[:, None], cols].long() * bs + p % bs, first.clamp(min=0)


def _to(a: np.ndarray, dev: torch.device) -> torch.Tensor:
    """``a`` on ``dev``: through pinned memory to a GPU (no pageable copy: no sync)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dev.type == "cpu" else t.pin_memory().to(dev, non_blocking=True)


class PoolTable(SlotTable):
    """A layer's finished pools of ``size`` tokens beside its KV cache, a row of ``width``
    values each (module docstring)."""

    def __init__(self, size: int, width: int) -> None:
        super().__init__(width)
        self.size, self.per = size, size

    def bind(self, cache: torch.Tensor, slots: int, dtype: torch.dtype, block_size: int = 1):
        """The rows that go with the KV ``cache`` of ``slots`` slots in blocks of
        ``block_size``: a row a gcd(size, block_size) slots."""
        self.per = math.gcd(self.size, block_size)
        return super().bind(cache, slots // self.per, dtype)

    def close(self, meta, summarize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        """The pools the step's tokens end: ``summarize(slots [N, size], first [N])`` gives
        each candidate pool's row [N, width] (`ends`), written where one ends."""
        e = ends(meta, self.size)
        spare = self.rows.shape[0] - 1
        at = torch.where(e.end, meta.slot_mapping[e.tok] // self.per, spare)
        self.rows.index_copy_(0, at, summarize(e.slots, e.first).to(self.rows.dtype))

    def gather(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` pools' rows [B, n, width] of each sequence, whose positions' cache
        slots are ``slots`` [B, K] (`dsa.index_plan`); a sequence's pools past its end are
        another's or stale (its scores mask them)."""
        last = slots[:, self.size - 1 : n * self.size : self.size]
        return self.rows[last // self.per]


def tables(model) -> list[SlotTable]:
    """Every layer's tables (`side_tables` of its layers)."""
    return [t for layer in getattr(model, "layers", ()) for t in getattr(layer, "side_tables", ())]
