"""Tables some sparse-attention layers keep beside their KV cache (`SlotTable`), and their bytes
in the KV budget (`block_bytes`, as DeepSeek-V4's entries count in `dsv4_engine.block_bytes`).

A table's rows are indexed by the KV cache's slots, so the KV manager's blocks carry them:
prefix hits, chunked prefill and preemption read the rows of the blocks they read the K/V rows
of. Each layer allocates its tables when it first sees a KV cache (a new cache, a new engine's,
gets new tables) with one spare row past the cache's slots: padding's (a CUDA graph's slot -1).

- **token rows** (one a slot): MiniMax-M3's indexer keys (`minimax_m3.BlockIndexer`),
  Qwen4-Exp's raw QSA keys (`qwen4_qsa.QsaIndexer`), Kolibri 1.1's raw keys of the layers whose
  pools a pool layer picks from (`kolibri1.Kolibri11Layer`). GLM-5-Next keeps its indexer keys
  in the latent row itself (`MlaConfig.cache_width`: counted as the KV rows are).

Every table's bytes a KV block takes (``block_bytes``, from the config alone) are counted where
the KV rows are: the runner's `bytes_per_block` (the pool's blocks), the start-up estimate
(`server/memory.kv_bytes_per_token`) and `server/fit.py`. The spare rows (one a table) are not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Spec:
    """One layer's tables: ``tokens`` values a slot (0: none)."""

    tokens: int

    def block_bytes(self, block_size: int, itemsize: int) -> int:
        return block_size * self.tokens * itemsize


def specs(mc) -> list[Spec]:
    """Every layer's tables (module docstring), in the model's dtype; none for most models."""
    f = mc.family
    q = getattr(f, "qwen4", None)
    if q is not None and q.indexer_heads:  # every attention layer's QSA indexer
        return [Spec(q.indexer_dim) for _ in mc.kv_layer_shapes]
    ix = getattr(f, "block_index", None)
    if ix is not None:  # MiniMax-M3's sparse layers
        return [Spec(ix.head_dim) for sparse in ix.layers if sparse]
    k = getattr(f, "kolibri11", None)
    if k is not None:  # the raw keys of the layers the pool layers pick from
        keepers = sorted({k.kv_source[i] for i, pool in enumerate(k.pool_layers) if pool})
        return [Spec(mc.head_dim) for _ in keepers]
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


def tables(model) -> list[SlotTable]:
    """Every layer's tables (`side_tables` of its layers)."""
    return [t for layer in getattr(model, "layers", ()) for t in getattr(layer, "side_tables", ())]
