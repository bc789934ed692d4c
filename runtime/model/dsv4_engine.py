"""DeepSeek-V4 (`DeepseekV4ForCausalLM`) in the engine (the design: docs/runtime.md, "DeepSeek-V4
in the engine"): `dsv4_model.Dsv4Model` run over the engine's step.

- **Caches** (`Dsv4LayerCache`, one per layer, the runner's `kv_backends`): each layer's paged
  token rows (one KV head of ``head_dim``, K = V) and, beside them in the same blocks, the
  compressed entries of its windows (``block_size / rate`` a block: CSA's and its indexer's,
  HCA's) and CSA's Ca tails (its last window's compressor rows, ``rate`` a block), all indexed
  by the block tables, so the KV manager's blocks (prefix caching, preemption) carry them. A
  block's bytes (`block_bytes`) count them all: the runner sizes the pool by them, the start-up
  estimate (`server/memory.py`) too. ``block_size`` must be a multiple of every compress rate
  (one line otherwise, at start).
- **Open windows** (`Dsv4Slots`): each running sequence's compressor inputs of the windows not
  closed yet (CSA ≤ ``2 rate - 1`` rows of ``kv_proj`` / ``gate_proj``, HCA ≤ ``rate - 1``),
  in preallocated slots of ``--max-num-seqs`` per layer (as the hybrids' state slots,
  `worker/mamba_state.py`), each held by a request while it runs and taken back when the free
  ones run out. A slot that does not hold what its sequence computed last (a new request, a
  preempted one restarting, a prefix-cache hit) starts afresh: empty at the first token, or, at a
  cached block boundary, CSA's from the block's Ca tail (HCA's is empty there); so preemption
  (recompute) and prefix caching need no snapshot.
- **The step**: `dsv4_layer.Batch.from_meta` (the attention metadata's layout), the step's slots
  gathered into each layer's `Dsv4Cache`, the model's streams, the slots written back, the
  sampling rows folded (``hc_head``), normed and projected.

The released checkpoints' block-wise FP8 matrices and FP4 routed experts are dequantized to
the dtype at load (`dsv4_quant.Dequantized`). Not supported (refused in one line:
`family_options.py`): FP8 weights (``--quantization fp8``), FP8/int8 KV caches, float16.
Tensor parallelism: each rank its query heads, output groups, experts' width and vocabulary
(`dsv4_shard`), the caches and slots whole on every rank (the step's slots sent to the other
ranks with its inputs: `HostStep.rows`). CUDA graphs are off (the step is eager: its indexer
picks and window bounds are read on the host). The routed experts run as `moe.SparseMoE` runs
them (`_experts`): the fused-MoE kernel with its ``silu_limit`` activation on CUDA, one
`Linear` pair an expert over its tokens elsewhere; routing (hash or sqrtsoftplus) and the shared
expert in `dsv4_model.Dsv4Moe`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from pagoda.runtime.cpu.host_memory import zeros
from pagoda.runtime.model import dsv4_shard
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsv4_config import CSA, SLIDING, Dsv4Config, expected_shapes
from pagoda.runtime.model.dsv4_layer import Batch, Dsv4Cache
from pagoda.runtime.model.dsv4_model import Dsv4Model
from pagoda.runtime.model.dsv4_quant import Dequantized
from pagoda.runtime.model.hy_v4 import silu_limit_and_mul
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import SEQUENCE_STATE, LlamaModel
from pagoda.runtime.model.moe import SparseMoE
from pagoda.runtime.model.parallel_linear import ParallelLMHead, VocabParallelEmbedding
from pagoda.runtime.request import RUNNING, Request

# the matrices the MoE holds once built (`Dsv4Moe`'s shared gate/up stacked, the routed experts)
_MOE_HELD = re.compile(r"\.experts\.|shared_experts\.(gate|up)_proj")


def compressors(c: Dsv4Config, layer: int) -> list[tuple[str, int]]:
    """Layer ``layer``'s compressors (name, kv / gate row width): CSA's (overlapping: twice
    ``head_dim``) and its indexer's, HCA's; none on a sliding layer."""
    kind = c.layer_types[layer]
    if kind == SLIDING:
        return []
    if kind == CSA:
        return [("kv", 2 * c.head_dim), ("index", 2 * c.index_head_dim)]
    return [("kv", c.head_dim)]


def slot_rows(c: Dsv4Config, layer: int) -> int:
    """The most rows a sequence's open-window slot holds (`dsv4_compressor.slot_start`): CSA's
    last closed window and the open one, HCA's open one."""
    rate = c.compress_rates[layer]
    return 2 * rate - 1 if c.layer_types[layer] == CSA else max(rate - 1, 0)


def block_bytes(c: Dsv4Config, layer: int, block_size: int, dtype: torch.dtype) -> int:
    """One block's bytes in layer ``layer``: token rows, entries, CSA's Ca tails."""
    rate, n = c.compress_rates[layer], block_size * c.head_dim
    for _, width in compressors(c, layer):
        n += block_size // rate * width // (2 if c.layer_types[layer] == CSA else 1)
        if c.layer_types[layer] == CSA:  # the tail: the last window's kv and gate rows
            n += rate * 2 * width
    return n * dtype.itemsize


def bytes_per_token(c: Dsv4Config, dtype: torch.dtype, block_size: int) -> int:
    """Every layer's cache bytes a token takes (`block_bytes` over the block, rounded up): what
    the start-up estimates count (`server/memory.py`, `server/fit.py`)."""
    total = sum(block_bytes(c, i, block_size, dtype) for i in range(c.num_layers))
    return -(-total // block_size)


def slots_bytes(c: Dsv4Config, dtype: torch.dtype, num_slots: int) -> int:
    """The open-window slots' bytes (`Dsv4Slots`, kv and gate rows per compressor)."""
    rows = sum(
        slot_rows(c, i) * width for i in range(c.num_layers) for _, width in compressors(c, i)
    )
    return 2 * num_slots * rows * dtype.itemsize


def check_block_size(c: Dsv4Config, block_size: int) -> None:
    """ValueError, one line, where the blocks do not end on window boundaries."""
    for rate in sorted(set(r for r in c.compress_rates if r)):
        if block_size % rate:
            raise ValueError(f"--block-size {block_size} is not a multiple of DeepSeek-V4's "
                             f"compress rate {rate}: use --block-size "
                             f"{np.lcm.reduce([r for r in c.compress_rates if r])}")  # fmt: skip


class Dsv4LayerCache:
    """Layer ``layer``'s cache as the runner allocates it (its entry of `kv_backends`)."""

    def __init__(self, c: Dsv4Config, layer: int) -> None:
        self.c, self.layer = c, layer

    def block_bytes(self, model_dtype: torch.dtype, block_size: int) -> int:
        return block_bytes(self.c, self.layer, block_size, model_dtype)

    def allocate_kv_cache(self, num_blocks, block_size, model_dtype, device) -> Dsv4Cache:
        c, i = self.c, self.layer
        check_block_size(c, block_size)
        rate, csa = c.compress_rates[i], c.layer_types[i] == CSA
        dt = model_dtype  # (`zeros`: lazily zeroed pages on the CPU, as the KV caches')
        cache = Dsv4Cache(zeros((num_blocks * block_size, c.head_dim), dt, device))
        for name, width in compressors(c, i):
            d = width // 2 if csa else width
            cache.entries[name] = zeros((num_blocks, block_size // rate, d), dt, device)
            if csa:
                cache.tails[name] = zeros((num_blocks, rate, 2 * width), dt, device)
        return cache

    def prepare(self, meta) -> None:
        """(The runner prepares every backend each step: nothing to build here.)"""


@dataclass
class HostStep:
    """A step's slots on the host (`Dsv4Slots.prepare`)."""

    slots: np.ndarray  # int64 [B]
    restored: np.ndarray | None  # bool [B]: slots to start from their last block's Ca tail

    def rows(self) -> np.ndarray:
        """int64 [2 B]: the slots, then which are restored (0 / 1): what rank 0 of a
        tensor-parallel group sends the others with the step (`worker/step_channel.py`)."""
        restored = np.zeros_like(self.slots) if self.restored is None else self.restored
        return np.concatenate([self.slots, restored.astype(np.int64)])

    @classmethod
    def of_rows(cls, rows: np.ndarray) -> HostStep:
        """`rows`' step back (another rank's)."""
        b = len(rows) // 2
        restored = rows[b:].astype(bool)
        return cls(rows[:b], restored if restored.any() else None)


@dataclass
class DeviceStep:
    slots: torch.Tensor
    restored: torch.Tensor | None


class Dsv4Slots:
    """Every layer's open-window slots (module docstring), ``num_slots`` of them."""

    def __init__(self, c: Dsv4Config, num_slots: int, dtype, device) -> None:
        self.c = c
        self.tensors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for i in range(c.num_layers):
            rows = slot_rows(c, i)
            for name, width in compressors(c, i):
                self.tensors[i, name] = tuple(
                    torch.zeros(num_slots, rows, width, dtype=dtype, device=device)
                    for _ in range(2)
                )
        self._slot: dict[str, int] = {}  # request id -> its slot
        self._owner: list[Request | None] = [None] * num_slots
        self._done = np.full(num_slots, -1, dtype=np.int64)  # tokens its slot has seen
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.tensors.values() for t in pair)

    def prepare(self, reqs: list[Request], starts: np.ndarray, qlens: np.ndarray) -> HostStep:
        """The step's slots (a slot claimed for a request without one), and which of them
        start from a block's tail: a slot that has not seen exactly its sequence's first
        ``start`` tokens starts afresh (at 0: empty; at a cached block's end: its tail)."""
        slots = np.empty(len(reqs), dtype=np.int64)
        for i, r in enumerate(reqs):
            s = self._slot.get(r.request_id)
            if s is None or self._owner[s] is not r:
                s = self._claim(r)
            slots[i] = s
        stale = (self._done[slots] != starts) & (starts > 0)
        self._done[slots] = starts + qlens
        return HostStep(slots, stale if stale.any() else None)

    def device_step(
        self, host: HostStep | np.ndarray, to_device: Callable[[np.ndarray], torch.Tensor]
    ) -> DeviceStep:
        """The step's slots on the device; ``host`` a `HostStep`, or on a tensor-parallel rank
        but the first its `HostStep.rows` as received (`worker/step_channel.py`)."""
        if isinstance(host, np.ndarray):
            host = HostStep.of_rows(host)
        restored = None if host.restored is None else to_device(host.restored)
        return DeviceStep(to_device(host.slots), restored)

    def gather(self, caches: list[Dsv4Cache], slots: torch.Tensor) -> None:
        """Each layer's step slots [B, rows, width] into its cache."""
        for (i, name), (kv, gate) in self.tensors.items():
            caches[i].slots[name] = (kv[slots], gate[slots])

    def scatter(self, caches: list[Dsv4Cache], slots: torch.Tensor) -> None:
        """The slots the step left back into their rows."""
        for (i, name), (kv, gate) in self.tensors.items():
            new_kv, new_gate = caches[i].slots.pop(name)
            n = new_kv.shape[1]
            if n:
                kv[slots, :n], gate[slots, :n] = new_kv, new_gate

    def _claim(self, req: Request) -> int:
        if not self._free:
            self._reclaim()
        s = self._free.pop()
        self._slot[req.request_id], self._owner[s], self._done[s] = s, req, -1
        return s

    def _reclaim(self) -> None:
        """Take back the slots of requests no longer running (finished, aborted, preempted)."""
        for rid, s in list(self._slot.items()):
            r = self._owner[s]
            if r is None or r.status != RUNNING or r.is_finished:
                del self._slot[rid]
                self._owner[s] = None
                self._free.append(s)
        if not self._free:
            raise RuntimeError("more running sequences than DeepSeek-V4 window slots")


class Dsv4EngineModel(LlamaModel):
    """The engine's DeepSeek-V4 (module docstring); `LlamaModel`'s interface to the runner."""

    def __init__(self, config, weights, *, dtype, device, batch_invariant=False, tp=None,
                 fp8=None, check_weights=True, backend=None, **_ignored) -> None:  # fmt: skip
        if fp8 is not None:  # (refused at start: family_options)
            raise ValueError("DeepSeek-V4 runs in 16 or 32 bits")
        self.config, self.c = config, config.family.dsv4
        self.backend = backend  # the runner's: it plans each step beside `kv_backends`
        self._moes: list[SparseMoE] = []
        self.dtype, self.device, self.tp = dtype, device, tp
        self.long_rope = {}
        weights = Dequantized(weights, self.c.quant, device)  # released FP8 / FP4, float32
        w = DeviceWeights(weights, device, dtype, {}, None, check_weights)
        w32 = DeviceWeights(weights, device, torch.float32, {}, None, check_weights)
        tensors = {}
        for name in expected_shapes(self.c):
            if name.endswith("tid2eid"):  # token -> experts, as stored (integers)
                tensors[name] = weights[name].to(device)
                continue
            src = w32 if dsv4_shard.FLOAT32.search(name) else w
            cut = None if tp is None else dsv4_shard.part(self.c, name, tp.layout)
            tensors[name] = src[name] if cut is None else src.part(name, *cut)  # (this rank's)
        limit = self.c.swiglu_limit
        ctx = SimpleNamespace(  # what `SparseMoE` reads of a `LayerContext`
            act_and_mul=lambda x: silu_limit_and_mul(x, float("inf") if limit is None else limit),
            batch_invariant=batch_invariant, tp=None,
        )  # fmt: skip
        reduce = None if tp is None else tp.all_reduce
        self.core = Dsv4Model(self.c, tensors, lambda i: self._experts(ctx, tensors, i), reduce)
        for name in [n for n in tensors if _MOE_HELD.search(n)]:  # (held by the MoE now)
            del tensors[name]
        self.lm_head = Linear(self.core.lm_head, invariant=batch_invariant)
        tensors.pop("lm_head.weight", None)  # (held by the Linear alone: a CPU packs it)
        self.core.lm_head = None  # (`core.__call__` is not the engine's: `forward`)
        if tp is not None:  # this rank's vocabulary rows (`parallel_linear.vocab_parallel`)
            start = tp.layout.vocab(self.c.vocab_size)[0]
            embed = VocabParallelEmbedding(tensors["model.embed_tokens.weight"], start, tp)
            self.core.embed = embed.rows
            self.lm_head = ParallelLMHead(self.lm_head, self.c.vocab_size, tp)
        self.vocab_size = self.c.vocab_size
        self.layers = []
        self.state: Dsv4Slots | None = None  # (`sequence_state`: the runner asks once)
        w.check_finite(tp)
        w32.check_finite(tp)

    def _experts(self, ctx, tensors, i: int):
        """Layer ``i``'s routed experts as `moe.SparseMoE` runs them: the fused kernel over
        stacked weights on CUDA (its ``silu_limit`` activation), one `Linear` pair an expert
        over its tokens elsewhere (`moe.grouped_experts`)."""
        c, x = self.c, f"model.layers.{i}.mlp.experts."
        pairs = [(torch.cat([tensors[f"{x}{j}.gate_proj.weight"], tensors[f"{x}{j}.up_proj.weight"]]),
                  tensors[f"{x}{j}.down_proj.weight"]) for j in range(c.num_experts)]  # fmt: skip
        w13 = w2 = None
        experts = []
        if self.device.type == "cuda":
            w13, w2 = torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
        else:
            experts = [(Linear(a, invariant=ctx.batch_invariant),
                        Linear(b, invariant=ctx.batch_invariant)) for a, b in pairs]  # fmt: skip
        moe = SparseMoE(ctx, None, experts, w13, w2, c.experts_per_token, c.norm_topk_prob, False)
        if c.swiglu_limit is not None:
            moe.fused_activation = dict(activation="silu_limit", limit=c.swiglu_limit)
        self._moes.append(moe)
        return moe.run_experts

    @property
    def kv_backends(self) -> list[Dsv4LayerCache]:
        return [Dsv4LayerCache(self.c, i) for i in range(self.c.num_layers)]

    def sequence_state(self, num_slots: int) -> Dsv4Slots:
        self.state = Dsv4Slots(self.c, num_slots, self.dtype, self.device)
        return self.state

    def linears(self) -> list[Linear]:
        return [*(x for m in self._moes for x in m.linears()[1:]), self.lm_head]

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        step: DeviceStep = meta.aux[SEQUENCE_STATE]
        state = self.state
        b = Batch.from_meta(meta, positions)
        if step.restored is not None:
            b = dataclasses.replace(b, restored=step.restored)
        state.gather(kv_caches, step.slots)
        streams = self.core.streams(input_ids, b, kv_caches)
        state.scatter(kv_caches, step.slots)
        x = self.core.head_input(streams.index_select(0, logits_indices))
        return self.logits(x, head)
