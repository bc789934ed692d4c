"""`LoRASlots`: the engine's adapters. Read adapters live in host memory (an LRU of at most
``--max-cpu-loras``, read again from their directory when evicted and needed); the ones the
step's requests run are copied into the device slots of every wrapped layer (``--max-loras``
of them; the least recently used slot that no request of the step needs is reused). The
scheduler keeps the distinct adapters of the running requests within ``--max-loras``
(`core/scheduler.py`), so a step's adapters always fit.

Which models take adapters (`lora_config.check_model`): the dense Llama-family decoders whose
every layer is `LlamaLayer`'s q/k/v, o, gate/up and down linears (Llama, Mistral, Qwen2,
Qwen3). Others are refused at start, one line.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np
import torch
from pagoda.runtime.lora.adapter import LoRAAdapter, module_shapes, read_adapter
from pagoda.runtime.lora.layer import LoRALinear, LoRAStep
from pagoda.runtime.lora_config import LoRAConfig, LoRARequest, check_model
from pagoda.runtime.model_config import ModelConfig


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

    # -- the model --------------------------------------------------------------------------
    def wrap(self, model) -> None:
        """Wrap every layer's q/k/v, o, gate/up and down of `model` (`LlamaModel`)."""
        from pagoda.runtime.model.linear import Linear
        from pagoda.runtime.model.llama import GatedMLP, LlamaLayer

        mc, shapes = self.model_config, module_shapes(self.model_config)
        slots, rank = self.config.max_loras + 1, self.config.max_lora_rank
        linear = functools.partial(Linear, invariant=model.batch_invariant)
        self.dtype, self.num_slots = model.dtype, slots
        for layer in model.layers:
            if type(layer.mlp) is not GatedMLP or not isinstance(layer, LlamaLayer):
                raise ValueError(f"LoRA adapters: {mc.architecture!r} layers are not Llama's")
            if not all(isinstance(x, Linear) for x in layer.linears()):
                raise ValueError("LoRA adapters need the model's plain linear layers (not FP8 "
                                 "or tensor-parallel ones)")  # fmt: skip

            def wrapper(base, names: list[str]) -> LoRALinear:
                parts = [(n, shapes[n][1]) for n in names]
                return LoRALinear(base, parts, shapes[names[0]][0], slots, rank, self.step,
                                  model.dtype, model.device, linear)  # fmt: skip

            qkv = wrapper(layer.qkv, ["q_proj", "k_proj", "v_proj"])
            o = wrapper(layer.o_proj, ["o_proj"])
            gate_up = wrapper(layer.mlp.gate_up, ["gate_proj", "up_proj"])
            down = wrapper(layer.mlp.down, ["down_proj"])
            layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down = qkv, o, gate_up, down
            self.layers.append({"q_proj": qkv, "o_proj": o, "gate_proj": gate_up,
                                "down_proj": down})  # fmt: skip

    # -- adapters in host memory --------------------------------------------------------------
    def adapter(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter `request` names, from the host LRU or read now (ValueError if bad)."""
        i = request.lora_int_id
        seen = self.known.get(i)
        if seen is not None and seen.lora_path != request.lora_path:
            raise ValueError(f"lora_int_id {i} is adapter {seen.lora_name!r} ({seen.lora_path}); "
                             f"{request.lora_name!r} at {request.lora_path} needs another id")  # fmt: skip
        found = self.cpu.get(i)
        if found is not None:
            self.cpu.move_to_end(i)
            return found
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
        return self.known.pop(lora_int_id, None) is not None

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
        adapter = self.adapter(request)
        for layer, wrappers in enumerate(self.layers):
            mine = {m: ab for (li, m), ab in adapter.weights.items() if li == layer}
            for w in wrappers.values():
                w.load(slot, mine)
        self.slot_of[i] = slot
        return slot

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
