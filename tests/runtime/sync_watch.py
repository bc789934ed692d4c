"""`SyncWatch`: the aten ops that wait for the device on CUDA, and the Tensor methods that read a
tensor to the host, recorded while active, on a CPU (`model/test_forward_sync_free.py`: a
family's forward; `engine/test_spec_decode.py`: a drafted step launched under async
scheduling)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that wait for the device on CUDA (the value, or the output's size, is read back)
SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2",
           "aten::unique_consecutive", "aten::unique_dim", "aten::bincount"}  # fmt: skip
# Tensor methods that read a CUDA tensor to the host without an aten op on a CPU one
READBACKS = ("tolist", "numpy", "cpu", "item", "__array__")


class SyncWatch(TorchDispatchMode):
    """Records the aten ops of `SYNCING` dispatched, and the `READBACKS` called, while active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.saved = {name: getattr(torch.Tensor, name) for name in READBACKS}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNCING:
            self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, self._recording(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _recording(self, name, method):
        def call(tensor, *args, **kwargs):
            self.seen.append(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)

        return call
