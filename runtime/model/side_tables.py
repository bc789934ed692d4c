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
  (NVFP4). A pool's row is written once, by the step whose token ends it (`PoolTable.close`:
  each step token's candidate pool from its ``size`` slots through the block table, O(step
  tokens), written where one ends), at its last token's slot // gcd(size, block_size) (no two
  pools share a row); the selection then reads the finished pools' rows
  (`PoolTable.gather`) in place of pooling the whole context's token rows every step.

Every table's bytes a KV block takes (``block_bytes``, from the config alone) are counted where
the KV rows are: the runner's `bytes_per_block` (the pool's blocks), the start-up estimate
(`server/memory.kv_bytes_per_token`) and `server/fit.py`. The spare rows (one a table) are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

POOLS = "side_pools"  # `meta.aux`: {size: `ends(meta, size)`} of the step


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
            self.rows = torch.zeros(slots + 1, self.width, dtype=dtype, device=cache.device)
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


def ends(meta, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(slots [T, size], first [T], ends [T]) of the step's tokens: the cache slots of the pool
    of ``size`` positions ending at each token (through its sequence's block table; clamped at
    the sequence's start), that pool's first position, and whether the token ends a pool (its
    position + 1 a multiple of ``size``; not padding). Device tensors only (a CUDA graph's
    inputs), once a step and size (`meta.aux`)."""
    done = meta.aux.setdefault(POOLS, {})
    if size in done:
        return done[size]
    qsl, table, bs = meta.query_start_loc, meta.block_tables, meta.block_size
    tok = torch.arange(meta.slot_mapping.shape[0], device=qsl.device, dtype=qsl.dtype)
    seq = torch.searchsorted(qsl[1:], tok, right=True).clamp_(max=table.shape[0] - 1)
    pos = (meta.seq_lens[seq] - qsl[seq + 1] + tok).long()  # each token's position
    first = pos - (size - 1)
    p = (first[:, None] + torch.arange(size, device=pos.device)).clamp_(min=0)
    cols = (p // bs).clamp_(max=table.shape[1] - 1)
    slots = table[seq[:, None], cols].long() * bs + p % bs
    end = (meta.slot_mapping >= 0) & (first >= 0) & ((pos + 1) % size == 0)
    done[size] = slots, first.clamp(min=0), end
    return done[size]


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
        """The pools the step's tokens end: ``summarize(slots [T, size], first [T])`` gives
        each token's candidate pool's row [T, width] (`ends`), written where one ends."""
        slots, first, end = ends(meta, self.size)
        spare = self.rows.shape[0] - 1
        at = torch.where(end, meta.slot_mapping // self.per, spare)
        self.rows.index_copy_(0, at, summarize(slots, first).to(self.rows.dtype))

    def gather(self, slots: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` pools' rows [B, n, width] of each sequence, whose positions' cache
        slots are ``slots`` [B, K] (`dsa.index_plan`); a sequence's pools past its end are
        another's or stale (its scores mask them)."""
        last = slots[:, self.size - 1 : n * self.size : self.size]
        return self.rows[last // self.per]


def tables(model) -> list[SlotTable]:
    """Every layer's tables (`side_tables` of its layers)."""
    return [t for layer in getattr(model, "layers", ()) for t in getattr(layer, "side_tables", ())]
