"""A checkpoint's tensors as metadata (`server/weights.py` counts what the engine holds of
them): each tensor's name as the loader reads it, stored type, shape and bytes, no data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# safetensors dtype -> bytes per element
ITEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
         "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip


@dataclass(frozen=True)
class Stored:
    """One checkpoint tensor as the model reads it: HF name, stored type, shape, bytes."""

    name: str
    kind: str  # a GGUF type ("Q4_1", "F32") or a safetensors dtype ("BF16", "F8_E4M3")
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Checkpoint:
    """The tensors of a checkpoint (metadata only) and its files' size."""

    form: str  # "GGUF", "safetensors", ".bin" (pickles), "file" (its size only), "" (none)
    tensors: dict[str, Stored] = field(default_factory=dict)
    file_bytes: int = 0

    def kinds(self) -> str:
        """The stored types that hold most of the bytes, largest first ("Q4_1/Q8_0")."""
        by: dict[str, int] = {}
        for t in self.tensors.values():
            by[t.kind] = by.get(t.kind, 0) + t.nbytes
        total = sum(by.values()) or 1
        top = sorted((k for k in by if by[k] >= total / 20), key=lambda k: -by[k])
        return "/".join(top[:3])
