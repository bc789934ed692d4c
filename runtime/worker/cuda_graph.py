"""CUDA graphs for decode steps: one recorded forward per padded batch size, replayed with new
inputs copied into static buffers. Launch overhead of ~30 layers × ~10 kernels disappears, and
replay never waits on the GPU.

Padding rows have sequence length 0 (the attention kernels write zeros for them), slot -1 (the
KV write skips them) and token 0; their logits are computed and ignored. `max_seq_len` is the
capture bound `max_model_len`, so the split-KV choice of the attention launcher is fixed at
capture time and valid for every replay.
"""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.attention.base import AttentionMetadata

CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


class CudaGraphRunner:
    def __init__(
        self, model, kv_caches, block_size: int, max_batch: int, max_model_len: int, device
    ) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_model_len, self.device = max_model_len, device
        self.sizes = [s for s in CAPTURE_SIZES if s <= max_batch] or [1]
        if self.sizes[-1] < max_batch and max_batch <= CAPTURE_SIZES[-1]:
            self.sizes.append(max_batch)
        n, width = self.sizes[-1], (max_model_len + block_size - 1) // block_size
        self.max_blocks = width
        i64, i32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.full((n,), -1, **i64)
        self.seq_lens = torch.zeros(n, **i32)
        self.block_tables = torch.zeros((n, width), **i32)
        self.query_start_loc = torch.arange(n + 1, **i32)
        self.logits_indices = torch.arange(n, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_seqs=b,
            num_decodes=b,
            num_tokens=b,
            max_query_len=1,
            max_seq_len=self.max_model_len,
            query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b],
            slot_mapping=self.slot_mapping[:b],
            block_size=self.block_size,
            query_lens_host=[1] * b,
            seq_lens_host=[self.max_model_len] * b,
        )

    def _forward(self, b: int) -> torch.Tensor:
        return self.model.forward(
            self.input_ids[:b],
            self.positions[:b],
            self.kv_caches,
            self._meta(b),
            self.logits_indices[:b],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest size first, all sharing one memory pool (as vLLM does)."""
        pool = None
        stream = torch.cuda.Stream(self.device)
        for b in reversed(self.sizes):
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self._forward(b)  # warm-up: Triton compiles, allocator settles
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = self._forward(b)
            pool = graph.pool() if pool is None else pool
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, num_decodes: int, num_seqs: int, max_blocks: int) -> bool:
        """Only pure-decode steps that fit the largest captured batch and the table width."""
        return (
            num_decodes == num_seqs and num_seqs <= self.sizes[-1] and max_blocks <= self.max_blocks
        )

    def run(
        self, runner, ids: torch.Tensor, positions, slots, table: np.ndarray, seq_lens: np.ndarray
    ) -> torch.Tensor:
        """Copy this step's inputs (`ids` already on the device) into the static buffers,
        replay, return logits [n, vocab]."""
        n = len(ids)
        b = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(ids, non_blocking=True)
        self.positions[:n].copy_(runner.to_device(positions), non_blocking=True)
        self.slot_mapping[:n].copy_(runner.to_device(slots), non_blocking=True)
        self.seq_lens[:n].copy_(runner.to_device(seq_lens), non_blocking=True)
        self.block_tables[:n, : table.shape[1]].copy_(runner.to_device(table), non_blocking=True)
        if b > n:  # padding rows: no context, no KV write
            self.seq_lens[n:b].zero_()
            self.slot_mapping[n:b].fill_(-1)
            self.input_ids[n:b].zero_()
            self.positions[n:b].zero_()
        self.graphs[b].replay()
        return self.outputs[b][:n]
