"""Launch parameters for the kernels, stored as JSON data keyed by device name and shape bucket.

Why data and not Triton's autotuner: the autotuner benchmarks on first use, which would stall the
first request and break CUDA-graph capture. Here a lookup is a cached dict access, and a per-node
tuning run (``pagoda tune``) can write better numbers later with :func:`save_kernel_config`.

File layout (``configs/<Device_Name>.json``; ``default.json`` always exists)::

    {"device": "NVIDIA H200", "source": "how the numbers were obtained",
     "kernels": {"paged_attention": [{"shape": {"head_dim": 128, "max_query_len": 1},
                                      "config": {"BLOCK_M": 16, "TILE_SIZE": 32, ...}}, ...]}}

Lookup: the bucket whose shape is nearest (sum of |log2| differences over the requested keys)
wins; its config is laid over the nearest ``default.json`` bucket, so a tuned file may hold only
some kernels or some fields. The search path, kernel by kernel: the directories given to
:func:`set_config_dirs` (a tuned profile's, set by `pagoda serve --tuned-profile`), then those in
``$PAGODA_KERNEL_CONFIG_DIR`` (``os.pathsep`` separated), then the packaged ``configs/`` folder.
The first device file that names a kernel gives its buckets, so a file holding only the matmuls
leaves the packaged attention configs in force.

Every file is validated when it is read (`pagoda.kernels.config_schema`: known kernels, known
parameters, power-of-two tile sizes in range), so a broken file fails at start-up with its name
and field, not at a kernel launch. ``default.json`` is read from the packaged folder and from
``$PAGODA_KERNEL_CONFIG_DIR`` only: the directories of :func:`set_config_dirs` (a tuned profile)
apply to the device they were measured on, never as every device's default.
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from pagoda.kernels.config_schema import KernelConfigError, read_config_file, validate
from pagoda.kernels.config_schema import file_name as config_file_name

__all__ = [
    "KernelConfigError",
    "check_config_files",
    "clear_config_cache",
    "config_file_name",
    "get_kernel_config",
    "save_kernel_config",
    "set_config_dirs",
]

PACKAGE_CONFIG_DIR = Path(__file__).resolve().parent / "configs"
CONFIG_DIR_ENV = "PAGODA_KERNEL_CONFIG_DIR"
DEFAULT_DEVICE = "default"
_config_dirs: tuple[Path, ...] = ()  # set_config_dirs: searched first


@functools.lru_cache(maxsize=16)
def _cuda_device_info(index: int) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count


def device_name(device: torch.device | None) -> str:
    """Name used to pick a config file; non-CUDA devices (the interpreter) use the defaults."""
    if device is None or device.type != "cuda":
        return DEFAULT_DEVICE
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_device_info(index)[0]


def num_sms(device: torch.device | None) -> int:
    """Streaming multiprocessors of a CUDA device; a small fixed count for the CPU interpreter."""
    if device is None or device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_device_info(index)[1]


def set_config_dirs(dirs: Iterable[str | os.PathLike[str]]) -> tuple[Path, ...]:
    """Search ``dirs`` first from now on (replacing the previous call's); returns those, so a
    caller can put them back. Loaded files are forgotten."""
    global _config_dirs
    previous, _config_dirs = _config_dirs, tuple(Path(d) for d in dirs)
    clear_config_cache()
    return previous


def config_dirs() -> tuple[Path, ...]:
    """The directories :func:`set_config_dirs` put first."""
    return _config_dirs


def _search_dirs(device: str | None = None) -> list[Path]:
    env = [Path(p) for p in os.environ.get(CONFIG_DIR_ENV, "").split(os.pathsep) if p]
    first = [] if device == DEFAULT_DEVICE else list(_config_dirs)  # profiles: their device only
    return [*dict.fromkeys([*first, *env]), PACKAGE_CONFIG_DIR]


@functools.lru_cache(maxsize=64)
def _load_files(device: str) -> tuple[dict[str, Any], ...]:
    """Every ``<device>.json`` on the search path, most specific (first searched) first, each
    validated (KernelConfigError names the file and the field)."""
    found = []
    for folder in _search_dirs(device):
        path = folder / config_file_name(device)
        if path.is_file():
            complete = device == DEFAULT_DEVICE and folder == PACKAGE_CONFIG_DIR
            found.append(read_config_file(path, complete=complete))
    return tuple(found)


def check_config_files(device: torch.device | str | None = None) -> None:
    """Read and validate the files ``device`` (and every device) would use, now: serving calls
    this before it binds, so a broken file is one line at start-up. KernelConfigError if not."""
    name = device if isinstance(device, str) else device_name(device)
    _load_files(DEFAULT_DEVICE)
    _load_files(name)


def _load_file(device: str) -> dict[str, Any] | None:
    files = _load_files(device)
    return files[0] if files else None


def _distance(want: Mapping[str, int], have: Mapping[str, Any]) -> float:
    total = 0.0
    for key, value in want.items():
        if key not in have:
            total += 64.0  # a bucket that does not name the key is a poor match
            continue
        total += abs(math.log2(max(int(value), 1)) - math.log2(max(int(have[key]), 1)))
    return total


def _nearest(buckets: list[dict[str, Any]], shape: Mapping[str, int]) -> dict[str, Any]:
    best = min(buckets, key=lambda b: _distance(shape, b.get("shape", {})))
    return dict(best["config"])


@functools.lru_cache(maxsize=4096)
def _lookup(kernel: str, shape_items: tuple[tuple[str, int], ...], device: str) -> dict[str, Any]:
    shape = dict(shape_items)
    default = _load_file(DEFAULT_DEVICE)
    if default is None or kernel not in default["kernels"]:
        raise KeyError(f"no default launch config for kernel {kernel!r} in {PACKAGE_CONFIG_DIR}")
    config = _nearest(default["kernels"][kernel], shape)
    if device != DEFAULT_DEVICE:  # the first file that tunes this kernel: a tuning run that
        for tuned in _load_files(device):  # measured only the matmuls keeps the packaged rest
            if tuned["kernels"].get(kernel):
                config.update(_nearest(tuned["kernels"][kernel], shape))
                break
    return config


def get_kernel_config(
    kernel: str, shape: Mapping[str, int], device: torch.device | str | None = None
) -> dict[str, Any]:
    """Launch parameters for ``kernel`` at ``shape`` on ``device`` (a copy; safe to modify)."""
    name = device if isinstance(device, str) else device_name(device)
    return dict(_lookup(kernel, tuple(sorted((k, int(v)) for k, v in shape.items())), name))


def clear_config_cache() -> None:
    """Forget loaded files (after a tuning run wrote new ones, or in tests)."""
    _load_files.cache_clear()
    _lookup.cache_clear()


def save_kernel_config(
    kernel: str,
    shape: Mapping[str, int],
    config: Mapping[str, Any],
    *,
    device: str,
    directory: str | os.PathLike[str] | None = None,
    source: str | None = None,
) -> Path:
    """Insert or replace one tuned bucket in ``<directory>/<device>.json``; returns the path.

    The file is rewritten atomically so a runtime starting concurrently never reads half of it.
    ``directory`` defaults to the first directory on the search path (see the module docstring).
    """
    if directory is None:
        directory = _search_dirs(device)[0]
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / config_file_name(device)
    data: dict[str, Any] = {"device": device, "kernels": {}}
    if path.is_file():
        data = read_config_file(path)
    if source is not None:
        data["source"] = source
    shape_dict = {k: int(v) for k, v in shape.items()}
    buckets = [
        b for b in data.setdefault("kernels", {}).get(kernel, []) if b["shape"] != shape_dict
    ]
    buckets.append({"shape": shape_dict, "config": dict(config)})
    data["kernels"][kernel] = buckets
    validate(data, path)  # never write a file that serving would refuse
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)
    clear_config_cache()
    return path
