"""An allocator's peak measured on the CPU, op by op: shared by test_hybrid_ssm.py (the scan's
temporaries against their estimate) and benchmarks/mamba_prefill.py (a step's peak)."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """The peak bytes of the storages that ops create under it and that some tensor still
    holds: a view of, or a write into, a storage made before (or one of `inputs`') is not
    counted."""

    def __init__(self, inputs: tuple[torch.Tensor, ...] | list[torch.Tensor] = ()) -> None:
        super().__init__()
        self.outside = {t.untyped_storage().data_ptr() for t in inputs}
        self.live: dict[int, list[int]] = {}  # storage -> [bytes, tensors holding it]
        self.now = self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made = not (func.is_view or func._schema.is_mutable)  # a view or in-place op: not new
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = s.data_ptr()
                if key in self.outside or s.nbytes() == 0:
                    continue
                if key not in self.live and not made:
                    continue  # (a view of, or a write into, a storage made before)
                if key not in self.live:
                    self.live[key] = [s.nbytes(), 0]
                    self.now += s.nbytes()
                self.live[key][1] += 1
                weakref.finalize(t, self._release, key)
        self.peak = max(self.peak, self.now)
        return out
