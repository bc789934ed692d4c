"""What a kernel launch-config file may hold, checked when it is read (torch-free).

A config file (``configs/<Device>.json``, or one in a tuned profile) is data from disk: a profile
may be hand-edited, truncated by a full disk, or hostile. Everything in it is checked here when
the file is loaded, so a bad value is one error naming the file and the field, at start-up,
never a ``KeyError``, ``AttributeError`` or a Triton compile error at a kernel's first launch::

    {"device": "NVIDIA H200", "source": "free text",
     "kernels": {"<kernel>": [{"shape": {"<key>": int, ...}, "config": {"<param>": value, ...}}]}}

Per kernel: the shape keys it is looked up with and the launch parameters it reads, each with
its range (tile sizes are powers of two the kernels compile for). A tuned file may give only
some parameters (the rest come from ``default.json``); ``default.json`` must give them all.
Imported without torch by `pagoda.runtime.tuned_profile` (the operator checks a profile before
it publishes it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 16 << 20  # the packaged files are ~10 kB; a profile's must fit a ConfigMap
MAX_DEPTH = 16  # the format nests 5 deep
MAX_BUCKETS = 4096  # per kernel
TOP_KEYS = ("device", "source", "kernels")


class KernelConfigError(ValueError):
    """A kernel-config file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Param:
    """A launch parameter: an integer in [low, high] (a power of two when ``pow2``), or any
    finite number in that range when ``real``."""

    low: float
    high: float
    pow2: bool = False
    real: bool = False

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {_show(value)}"
        if not self.real and not isinstance(value, int):
            return f"must be an integer, got {_show(value)}"
        if not (self.low <= value <= self.high):  # NaN fails too
            return f"must be in {self.low:g}..{self.high:g}, got {_show(value)}"
        if self.pow2 and value & (value - 1):
            return f"must be a power of two in {self.low:g}..{self.high:g}, got {_show(value)}"
        return None


WARPS = Param(1, 32, pow2=True)
STAGES = Param(1, 8)
TILE = Param(16, 256, pow2=True)  # tl.dot needs >= 16; larger tiles do not fit shared memory
GROUP = Param(1, 128)
ROWS = Param(1, 64, pow2=True)  # rows per program
_GEMM = {"BLOCK_M": TILE, "BLOCK_N": TILE, "BLOCK_K": TILE, "GROUP_M": GROUP,
         "num_warps": WARPS, "num_stages": STAGES}  # fmt: skip


@dataclass(frozen=True)
class KernelSchema:
    shape: tuple[str, ...]  # the keys `get_kernel_config` is called with
    params: Mapping[str, Param]
    optional: tuple[str, ...] = ()  # params default.json need not give


# fmt: off
KERNELS: Mapping[str, KernelSchema] = {
    "paged_attention": KernelSchema(
        ("head_dim", "max_query_len"),
        {"BLOCK_M": TILE, "TILE_SIZE": Param(16, 512, pow2=True), "num_warps": WARPS,
         "num_stages": STAGES},
    ),
    "prefill_attention": KernelSchema(
        ("head_dim", "max_query_len"),
        {"BLOCK_M": TILE, "TILE_SIZE": Param(16, 512, pow2=True), "num_warps": WARPS,
         "num_stages": STAGES},
    ),
    "decode_attention": KernelSchema(
        ("head_dim", "num_seqs", "max_seq_len"),
        {"TILE_SIZE": Param(16, 512, pow2=True), "num_warps": WARPS, "num_stages": STAGES,
         "waves": Param(0.125, 64, real=True), "min_tokens_per_split": Param(1, 1 << 20),
         "max_splits": Param(1, 1024), "num_splits": Param(1, 1024)},
        optional=("num_splits",),
    ),
    "write_kv_cache": KernelSchema(("row",), {"num_warps": WARPS}),
    "rms_norm": KernelSchema(("hidden",), {"num_warps": WARPS}),
    "rotary_embedding": KernelSchema(("heads", "rotary_dim"), {"num_warps": WARPS}),
    "matmul": KernelSchema(("n", "k"), _GEMM),
    "silu_and_mul": KernelSchema(
        ("intermediate",),
        {"BLOCK": Param(16, 1 << 16, pow2=True), "num_warps": WARPS, "ROWS": ROWS},
        optional=("ROWS",),
    ),
    "fused_moe": KernelSchema(("experts", "intermediate", "hidden", "itemsize", "tokens"), _GEMM),
    "fp8_matmul": KernelSchema(("n", "k"), _GEMM),
    "fp8_quant": KernelSchema(
        ("hidden",), {"ROWS": ROWS, "BLOCK": Param(16, 1 << 16, pow2=True), "num_warps": WARPS}
    ),
}
# fmt: on
SHAPE_VALUE = Param(1, 1 << 40)


def file_name(device: str) -> str:
    """``"NVIDIA H200"`` → ``"NVIDIA_H200.json"`` (anything but letters/digits/-/. becomes _)."""
    return re.sub(r"[^A-Za-z0-9.\-]+", "_", device.strip()) + ".json"


def read_config_file(
    path: Path, *, complete: bool = False, max_bytes: int = MAX_FILE_BYTES
) -> dict[str, Any]:
    """Read and validate one config file; KernelConfigError names what is wrong.

    ``complete``: every kernel and every parameter must be given (``default.json``).
    """
    data = read_json_file(path, max_bytes, MAX_DEPTH, KernelConfigError)
    validate(data, path, complete=complete)
    return data


class HugeInt:
    """An integer literal too long to be a real value (kept as its length, never converted:
    Python refuses to parse more than 4,300 digits, and a field's check then names it)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def read_json_file(path: Path, max_bytes: int, max_depth: int, error: type[ValueError]) -> Any:
    """The JSON in ``path``, read with every guard a hostile file needs; ``error`` (a ValueError
    subclass) names the file and what is wrong: unreadable, too large, not UTF-8, nested deeper
    than ``max_depth``, truncated, ``NaN``/``Infinity``. Integers longer than 40 digits become
    `HugeInt`, for the caller's field check to refuse by name."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from e
    if len(raw) > max_bytes:
        raise error(f"{path}: larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 (invalid byte at offset {e.start})") from e
    deep = nesting_beyond(text, max_depth)
    if deep is not None:
        raise error(f"{path}: {deep[1] or 'the top level'} nests deeper than {max_depth} levels "
                    f"(character {deep[0]})")  # fmt: skip
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}; "
                    "truncated?)") from e  # fmt: skip
    except (ValueError, RecursionError) as e:
        raise error(f"{path}: not usable JSON ({_first_line(e)})") from e


def _parse_int(text: str) -> int | HugeInt:
    return int(text) if len(text) <= 40 else HugeInt(len(text.lstrip("-")))


def nesting_beyond(text: str, limit: int) -> tuple[int, str] | None:
    """(character offset, the field it is in, as ``a.b``) where brackets nest deeper than
    ``limit`` (strings skipped), or None. Linear and without recursion: the JSON parser itself
    raises RecursionError on ``[`` × 100,000."""
    opened: list[str | None] = []  # per open bracket: the key it is the value of
    key = None  # the last key seen, until its value opens or another key comes
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok in "[{":
            opened.append(key)
            key = None
            if len(opened) > limit:
                return m.start(), ".".join(k for k in opened[:4] if k)
        elif tok in "]}":
            if opened:
                opened.pop()
            key = None
        elif tok.endswith(":"):
            key = tok[1 : tok.rindex('"')][:40]
    return None


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?\s*:?|[\[\]{}]', re.DOTALL)


def validate(data: Any, where: Any, *, complete: bool = False) -> None:
    """Check a parsed config file (module docstring); KernelConfigError names the field."""
    if not isinstance(data, dict):
        raise KernelConfigError(f"{where}: expected a JSON object, got {_kind(data)}")
    extra = sorted(set(data) - set(TOP_KEYS))
    if extra:
        raise KernelConfigError(f"{where}: unknown field {_show(extra[0])} (known: "
                                f"{', '.join(TOP_KEYS)})")  # fmt: skip
    device = data.get("device")
    if not isinstance(device, str) or not device or len(device) > 256:
        raise KernelConfigError(f"{where}: field 'device' must be a device name (a string)")
    name = getattr(where, "name", None)
    if name is not None and name != file_name(device):
        raise KernelConfigError(f"{where}: device {_show(device)} belongs in {file_name(device)}, "
                                f"not {name}")  # fmt: skip
    if "source" in data and not isinstance(data["source"], str):
        raise KernelConfigError(f"{where}: field 'source' must be a string")
    kernels = data.get("kernels")
    if not isinstance(kernels, dict):
        raise KernelConfigError(f"{where}: field 'kernels' must be an object, got {_kind(kernels)}")
    for kernel, buckets in kernels.items():
        _check_kernel(kernel, buckets, where, complete)
    if complete:
        missing = sorted(set(KERNELS) - set(kernels))
        if missing:
            raise KernelConfigError(f"{where}: kernels.{missing[0]} is missing (a default is "
                                    "needed for every kernel)")  # fmt: skip


def _check_kernel(kernel: str, buckets: Any, where: Any, complete: bool) -> None:
    schema = KERNELS.get(kernel)
    if schema is None:
        raise KernelConfigError(f"{where}: kernels.{_show(kernel)} is not a kernel (known: "
                                f"{', '.join(KERNELS)})")  # fmt: skip
    field = f"kernels.{kernel}"
    if not isinstance(buckets, list):
        raise KernelConfigError(f"{where}: {field} must be a list of buckets, got {_kind(buckets)}")
    if len(buckets) > MAX_BUCKETS or (complete and not buckets):
        raise KernelConfigError(f"{where}: {field} must hold 1..{MAX_BUCKETS} buckets")
    for i, bucket in enumerate(buckets):
        at = f"{field}[{i}]"
        if not isinstance(bucket, dict) or set(bucket) != {"shape", "config"}:
            raise KernelConfigError(
                f'{where}: {at} must be {{"shape": {{...}}, "config": {{...}}}}'
            )
        shape, config = bucket["shape"], bucket["config"]
        if not isinstance(shape, dict) or not shape:
            raise KernelConfigError(f"{where}: {at}.shape must be a non-empty object")
        for key, value in shape.items():
            if key not in schema.shape:
                raise KernelConfigError(f"{where}: {at}.shape.{_show(key)} is not a shape key of "
                                        f"{kernel} (known: {', '.join(schema.shape)})")  # fmt: skip
            bad = SHAPE_VALUE.problem(value)
            if bad:
                raise KernelConfigError(f"{where}: {at}.shape.{key} {bad}")
        if not isinstance(config, dict) or not config:
            raise KernelConfigError(f"{where}: {at}.config must be a non-empty object")
        _check_params(kernel, config, f"{where}: {at}.config", ".", complete)


def check_launch_config(kernel: str, config: Any) -> None:
    """A config handed straight to a launcher (``config=``, as tuning sweeps and benchmarks do)
    must be one a file could hold, complete: every parameter ``kernel`` reads, each in range
    (powers of two where Triton needs them). KernelConfigError names the field, rather than a
    ``KeyError`` or Triton's "arange's range must be a power of 2" at the launch."""
    where = f"{kernel} launch config"
    if not isinstance(config, Mapping):
        raise KernelConfigError(f"{where} must be an object, got {_kind(config)}")
    _check_params(kernel, config, where, ": ", complete=True)


def _check_params(kernel: str, config: Mapping, where: str, sep: str, complete: bool) -> None:
    """Each of ``config``'s parameters known to ``kernel`` and in range, named as
    ``{where}{sep}{key}``; with ``complete``, none that ``kernel`` needs left out."""
    schema = KERNELS[kernel]
    for key, value in config.items():
        param = schema.params.get(key)
        if param is None:
            raise KernelConfigError(f"{where}{sep}{_show(key)} is not a parameter of {kernel} "
                                    f"(known: {', '.join(schema.params)})")  # fmt: skip
        bad = param.problem(value)
        if bad:
            raise KernelConfigError(f"{where}{sep}{key} {bad}")
    if complete:
        missing = [k for k in schema.params if k not in config and k not in schema.optional]
        if missing:
            raise KernelConfigError(f"{where} lacks {missing[0]}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")  # fmt: skip


def _show(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {math.ceil(value.bit_length() * math.log10(2))} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
