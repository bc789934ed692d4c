"""A PyTorch pickle checkpoint file (`pytorch_model.bin`, or a shard `pytorch_model-0000x-of-
0000y.bin` named by `pytorch_model.bin.index.json`) read as safetensors' `safe_open` reads its
files: `keys()`, `get_tensor`, `get_slice` (`get_shape`, `get_dtype` as safetensors names it,
rows or columns read alone), so `SafetensorsWeights` lists, renames, splits and checks it alike.

The file is opened with ``torch.load(weights_only=True, mmap=True, map_location="cpu")`` only:
torch's restricted unpickler builds tensors, dicts and plain values and refuses any other global
(a pickle that would call ``os.system`` is refused before anything runs), and the storages stay
memory-mapped, so listing the tensors' dtypes and shapes (the start-up checks, the weights
estimate) reads no tensor data, and each tensor is copied out of the mapping when asked. Files in
torch's legacy (pre-1.6, non-zip) format cannot be mapped: they are read whole, still with
``weights_only=True``. Tensors sharing a storage (a tied embedding and LM head saved both) come
back as separate copies, as safetensors gives them; entries that are not tensors are not listed.
Anything torch cannot read becomes a ValueError of one line naming the file.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

BIN_INDEX = "pytorch_model.bin.index.json"
BIN_SINGLE = "pytorch_model.bin"
# torch dtype -> the safetensors dtype name (`stored.ITEM_BYTES`, `checkpoint_check`)
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
           torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
           torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}  # fmt: skip
_LFS = b"version https://git-lfs"
_GLOBAL = re.compile(r"(?i)unsupported global:?\s+(?:GLOBAL\s+)?([\w.]+)")


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of the pickle at `path`, memory-mapped (module docstring); ValueError, one
    line, for a file torch's weights-only unpickler refuses or cannot read."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_LFS)) == _LFS:
                raise ValueError(f"{path.name} is a Git LFS pointer, not the weights (fetch the "
                                 "LFS object itself)")  # fmt: skip
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise
            loaded = torch.load(path, map_location="cpu", weights_only=True)  # legacy format
    except ValueError:
        raise
    except pickle.UnpicklingError as e:
        found = _GLOBAL.search(str(e))
        if found is None:  # not a global: a byte no pickle has (a foreign or damaged file)
            said = str(e).partition("WeightsUnpickler error:")[2].strip().split("\n\n")[0]
            said = " ".join(said.split())[:200]
            raise ValueError(f"{path.name}: cannot read it as PyTorch weights (damaged or not "
                             f"a pickle: {said or 'unpickling failed'})") from None  # fmt: skip
        raise ValueError(
            f"{path.name}: refused: the pickle needs more than tensors to load ({found[1]}); "
            "pickled weights are read with torch.load(weights_only=True) only (convert it to "
            "safetensors from a trusted copy)"
        ) from None
    except Exception as e:  # a truncated or foreign file: the zip reader's or torch's error
        said = " ".join(str(e).split("\n")[0].split(". ")[0].split())[:200] or "empty or truncated"
        raise ValueError(f"{path.name}: cannot read it as PyTorch weights: "
                         f"{type(e).__name__}: {said}") from None  # fmt: skip
    if not isinstance(loaded, dict):
        raise ValueError(f"{path.name}: holds a {type(loaded).__name__}, not a state dict of "
                         "named tensors")  # fmt: skip
    tensors = {str(k): v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise ValueError(f"{path.name}: holds no tensors at its top level (not a state dict "
                         "saved by transformers?)")  # fmt: skip
    unknown = sorted({str(t.dtype) for t in tensors.values() if t.dtype not in _DTYPES})
    if unknown:
        raise ValueError(f"{path.name}: tensors of dtype {', '.join(unknown)} are not supported")
    return tensors


class PickleFile:
    """One pickle file's tensors through `safe_open`'s methods (module docstring)."""

    def __init__(self, path: Path) -> None:
        self._tensors = read_state_dict(Path(path))

    def keys(self) -> list[str]:
        return list(self._tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name].clone(memory_format=torch.contiguous_format)

    def get_slice(self, name: str) -> PickleSlice:
        return PickleSlice(self._tensors[name])


class PickleSlice:
    """A tensor's dtype and shape without its data, and parts of it copied out (`t[a:b]`,
    `t[:, a:b]`), as safetensors' `PySafeSlice`."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._t = tensor

    def get_shape(self) -> list[int]:
        return list(self._t.shape)

    def get_dtype(self) -> str:
        return _DTYPES[self._t.dtype]

    def __getitem__(self, index) -> torch.Tensor:
        return self._t[index].clone(memory_format=torch.contiguous_format)
