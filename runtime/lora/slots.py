"""`LoRASlots`: the engine's adapters. Read adapters live in host memory (an LRU of at most
``--max-cpu-loras``, read again from their directory when evicted and needed); the ones the
step's requests run are copied into the device slots of every wrapped layer (``--max-loras``
of them; the least recently used slot that no request of the step needs is reused). The
scheduler keeps the distinct adapters of the running requests within ``--max-loras``
(`core/scheduler.py`), so a step's adapters always fit.

With tensor parallelism rank 0 alone chooses the slots (in `prepare`) and hands each step's
loads, (slot, adapter), to the other ranks with the step (`take_loads`, `worker/step_channel.py`);
each of them reads the adapter from its path itself (as vLLM's workers do: the path is on every
node) and keeps its part (`shards`, `fill`).

Which models take adapters (`lora_config.check_model`): the dense Llama-family decoders whose
every layer is `LlamaLayer`'s q/k/v, o, gate/up and down linears (Llama, Mistral, Qwen2,
Qwen3). Others are refused at start, one line. Their linears may be 16-bit or FP8
(`model/fp8_linear.py`: ``--quantization fp8`` or an FP8 checkpoint): an adapter adds its
product to the base layer's output either way (`lora/layer.py`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch
from pagoda.runtime.lora.adapter import LoRAAdapter, module_shapes, read_adapter
from pagoda.runtime.lora.layer import LoRALinear, LoRAStep, Shard
from pagoda.runtime.lora_config import LoRAConfig, LoRARequest, check_model
from pagoda.runtime.model_config import ModelConfig

if TYPE_CHECKING:
    from pagoda.runtime.distributed.layout import TPLayout


def _background() -> None:
    """The reader thread yields the cores to the step's threads: the lowest priority (Linux
    sets a thread's nice value by its id; elsewhere, or where refused, it stays as it is)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


# each wrapped linear by its first module: the modules it stacks (q/k/v, gate/up)
WRAPPED = {"q_proj": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",),
           "gate_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}  # fmt: skip


def shards(mc: ModelConfig, lay: TPLayout | None) -> dict[str, tuple[list, int, Shard | None]]:
    """Per wrapped linear (`WRAPPED`): its parts' (module, output width), its input width, and
    with `lay` (a tensor-parallel rank) this rank's `Shard` of an adapter, split as the base
    layer is (`model/parallel_linear.py`): q/k/v by query heads and KV heads (`qkv_linear`:
    replicated KV heads' rows on each rank holding them), gate/up by even rows, o and down by
    even input columns."""
    shapes, out = module_shapes(mc), {}
    for first, names in WRAPPED.items():
        fin = shapes[first][0]
        if lay is None:
            out[first] = ([(n, shapes[n][1]) for n in names], fin, None)
        elif first in ("o_proj", "down_proj"):  # row-parallel: A's columns, B whole
            lo, hi = lay.even(fin)
            out[first] = ([(first, shapes[first][1])], hi - lo, Shard(cols=(lo, hi)))
        else:  # column-parallel: A whole, each part's rows of B
            if first == "q_proj":
                rows = lay.qkv_rows(mc.num_heads, mc.num_kv_heads, mc.head_dim)
            else:
                rows = [lay.even(shapes[n][1]) for n in names]
            parts = [(n, hi - lo) for n, (lo, hi) in zip(names, rows)]
            out[first] = (parts, fin, Shard(rows=tuple(rows)))
    return out


class LoRASlots:
    def __init__(self, config: LoRAConfig, mc: ModelConfig) -> None:
        check_model(mc)
        self.config, self.model_config = config, mc
        self.step = LoRAStep()
        self.layers: list[dict[str, LoRALinear]] = []  # per layer: module name → its wrapper
        self.cpu: OrderedDict[int, LoRAAdapter] = OrderedDict()  # LRU, most recent last
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # adapter id → slot, LRU
        self.free = list(range(config.max_loras, 0, -1))  # slots 1..max_loras, popped from end
        self.known: dict[int, LoRARequest] = {}  # every adapter id seen, and its request
        # rank 0 of a group: the step's loads for the others, (slot, adapter); slot 0: an
        # adapter being read, which they read ahead too
        self.loads: list[tuple[int, LoRARequest]] = []
        # adapters being read on the reader thread (`start_read`), by id
        self.reads: dict[int, tuple[LoRARequest, Future]] = {}
        self._reader: ThreadPoolExecutor | None = None
        self.sends = False  # rank 0 of a tensor-parallel group (`wrap`)

    # -- the model --------------------------------------------------------------------------
    def wrap(self, model) -> None:
        """Wrap every layer's q/k/v, o, gate/up and down of `model` (`LlamaModel`); on a
        tensor-parallel rank (`model.tp`) with this rank's part of each adapter (`shards`): a
        row-parallel layer's wrapper goes inside it, before its all-reduce."""
        from pagoda.runtime.model.fp8_linear import Fp8Linear
        from pagoda.runtime.model.linear import Linear
        from pagoda.runtime.model.llama import GatedMLP, LlamaLayer
        from pagoda.runtime.model.parallel_linear import RowParallelLinear

        mc, tp = self.model_config, model.tp
        slots, rank = self.config.max_loras + 1, self.config.max_lora_rank
        linear = functools.partial(Linear, invariant=model.batch_invariant)
        self.dtype, self.num_slots = model.dtype, slots
        self.sends = tp is not None and tp.rank == 0
        split = shards(mc, None if tp is None else tp.layout)
        for layer in model.layers:
            if type(layer.mlp) is not GatedMLP or not isinstance(layer, LlamaLayer):
                raise ValueError(f"LoRA adapters: {mc.architecture!r} layers are not Llama's")
            inner = [x.inner if isinstance(x, RowParallelLinear) else x for x in layer.linears()]
            if not all(isinstance(x, (Linear, Fp8Linear)) for x in inner):
                raise ValueError("LoRA adapters need the model's linear layers (16-bit or the "
                                 "FP8 GEMM's)")  # fmt: skip

            def wrapper(base, first: str) -> LoRALinear:
                parts, fin, shard = split[first]
                return LoRALinear(base, parts, fin, slots, rank, self.step, model.dtype,
                                  model.device, linear, shard)  # fmt: skip

            qkv, gate_up = wrapper(layer.qkv, "q_proj"), wrapper(layer.mlp.gate_up, "gate_proj")
            layer.qkv, layer.mlp.gate_up = qkv, gate_up
            if tp is None:
                o, down = wrapper(layer.o_proj, "o_proj"), wrapper(layer.mlp.down, "down_proj")
                layer.o_proj, layer.mlp.down = o, down
            else:  # the adapter's partial sum joins the base layer's before its all-reduce
                o = layer.o_proj.inner = wrapper(layer.o_proj.inner, "o_proj")
                down = layer.mlp.down.inner = wrapper(layer.mlp.down.inner, "down_proj")
            self.layers.append({"q_proj": qkv, "o_proj": o, "gate_proj": gate_up,
                                "down_proj": down})  # fmt: skip

    # -- adapters in host memory --------------------------------------------------------------
    def _check_id(self, request: LoRARequest) -> None:
        i = request.lora_int_id
        seen = self.known.get(i) or (self.reads[i][0] if i in self.reads else None)
        if seen is not None and seen.lora_path != request.lora_path:
            raise ValueError(f"lora_int_id {i} is adapter {seen.lora_name!r} ({seen.lora_path}); "
                             f"{request.lora_name!r} at {request.lora_path} needs another id")  # fmt: skip

    def start_read(self, request: LoRARequest) -> Future | None:
        """Read `request`'s adapter on the reader thread (one read per adapter at a time), so
        that the engine loop keeps stepping meanwhile; None when it is in host memory already.
        The engine thread takes the result in `adapter` (its error too: ValueError)."""
        self._check_id(request)
        i = request.lora_int_id
        if i in self.cpu:
            return None
        if i not in self.reads:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(1, thread_name_prefix="pagoda-lora-read",
                                                  initializer=_background)  # fmt: skip
            fut = self._reader.submit(read_adapter, request, self.model_config,
                                      self.config.max_lora_rank)  # fmt: skip
            self.reads[i] = (request, fut)
            if self.sends:  # the other ranks read it ahead too, from the next step on
                self.loads.append((0, request))
        return self.reads[i][1]

    def adapter(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter `request` names, from the host LRU, a read `start_read` began (waited
        for), or read now (ValueError if bad)."""
        self._check_id(request)
        i = request.lora_int_id
        found = self.cpu.get(i)
        if found is not None:
            self.cpu.move_to_end(i)
            return found
        _, fut = self.reads.pop(i, (None, None))
        if fut is not None:
            adapter = fut.result()
        else:
            adapter = read_adapter(request, self.model_config, self.config.max_lora_rank)
        self.known[i] = request
        self.cpu[i] = adapter
        while len(self.cpu) > self.config.max_cpu_loras:
            self.cpu.popitem(last=False)
        return adapter

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter (unloaded): its host copy and id; a device slot it holds is
        reused when needed. Whether it was known."""
        self.cpu.pop(lora_int_id, None)
        read = self.reads.pop(lora_int_id, None)  # (a read still running is let finish)
        return self.known.pop(lora_int_id, None) is not None or read is not None

    # -- the step ---------------------------------------------------------------------------
    def _slot(self, request: LoRARequest, busy: set[int]) -> int:
        """The device slot holding `request`'s adapter, loading it (into a free slot, else the
        least recently used one no request of this step needs)."""
        i = request.lora_int_id
        slot = self.slot_of.get(i)
        if slot is not None:
            self.slot_of.move_to_end(i)
            return slot
        if self.free:
            slot = self.free.pop()
        else:
            victim = next((k for k in self.slot_of if k not in busy), None)
            if victim is None:
                raise RuntimeError(f"more than --max-loras {self.config.max_loras} adapters in "
                                   "one step (the scheduler's limit was broken)")  # fmt: skip
            slot = self.slot_of.pop(victim)
        self._fill(slot, self.adapter(request))
        if self.sends:  # the other ranks put it in the same slot (`take_loads`)
            self.loads.append((slot, request))
        self.slot_of[i] = slot
        return slot

    def _fill(self, slot: int, adapter: LoRAAdapter) -> None:
        for layer, wrappers in enumerate(self.layers):
            mine = {m: ab for (li, m), ab in adapter.weights.items() if li == layer}
            for w in wrappers.values():
                w.load(slot, mine)

    # -- tensor parallelism: rank 0 chooses the slots, every rank holds its part ---------------
    def take_loads(self) -> list[tuple[int, LoRARequest]] | None:
        """Rank 0 of a group: the (slot, adapter) loads of the step just prepared, for the
        other ranks (`worker/step_channel.py`); None when there were none."""
        loads, self.loads = self.loads, []
        return loads or None

    def fill(self, loads: list[tuple[int, LoRARequest]]) -> None:
        """Another rank: put rank 0's loads of this step in the same slots, each adapter read
        here (the host LRU as on rank 0; its path is on every node, as vLLM's workers read
        theirs) and cut to this rank's part (`shards`). Slot 0: an adapter rank 0 is reading
        for a request that waits for it, read ahead here on the reader thread, so that the
        step that first runs it seldom waits for this rank's read."""
        for slot, request in loads:
            try:
                self._check_id(request)
            except ValueError:  # rank 0 gave the id to another adapter since
                self.remove(request.lora_int_id)
            if slot == 0:
                self.start_read(request)
            else:
                self._fill(slot, self.adapter(request))

    def prepare(self, reqs, qlens: np.ndarray) -> np.ndarray | None:
        """int64 [T]: each token's slot for the step's requests (`qlens` tokens each), their
        adapters loaded; None when none of them runs an adapter."""
        loras = [r.params.lora_request for r in reqs]
        if not any(loras):
            return None
        busy = {lr.lora_int_id for lr in loras if lr is not None}
        per_req = np.fromiter((0 if lr is None else self._slot(lr, busy) for lr in loras),
                              dtype=np.int64, count=len(loras))  # fmt: skip
        return np.repeat(per_req, qlens)

    def device_step(self, index: np.ndarray | None, to_device) -> None:
        """Set the step's index (and sgmv's groups) where the wrapped layers read it."""
        step = self.step
        if index is None:
            step.index, step.groups = None, []
            return
        step.index = to_device(index)
        if step.mode == "dense":  # [T, slots, 1]: 1 at each token's slot, made on the device
            onehot = torch.nn.functional.one_hot(step.index, self.num_slots)
            step.onehot = onehot.to(self.dtype).unsqueeze(2)
        if step.mode == "sgmv":
            step.groups = [(int(s), to_device(np.flatnonzero(index == s)))
                           for s in np.unique(index) if s != 0]  # fmt: skip
