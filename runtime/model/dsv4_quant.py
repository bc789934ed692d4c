"""DeepSeek-V4's released checkpoints (deepseek-ai/DeepSeek-V4-*): block-wise FP8 matrices and
FP4 routed experts, dequantized to the engine's dtype at load, as DeepSeek-V3's FP8 and
gpt-oss's MXFP4 (`mxfp4.py`) are.

The format, as transformers 5.25 reads it (``FineGrainedFP8Config`` with ``scale_fmt`` "ue8m0"
and ``expert_dtype`` "fp4", its ``Fp8Dequantize``; ``DeepseekV4Config`` moves a top-level
``expert_dtype`` into ``quantization_config``): config.json's ``quantization_config`` has
``quant_method`` "fp8", ``fmt`` "e4m3" and ``weight_block_size`` [128, 128].

- A quantized matrix ``X.weight`` [N, K] is ``F8_E4M3`` beside its scales ``X.scale`` (the name
  the files use; ``X.weight_scale_inv``, transformers' rename, is read too), one per tile of
  ``weight_block_size``: [ceil(N / bn), ceil(K / bk)]; value = code * scale.
- A routed expert's matrix (``expert_dtype`` "fp4") is ``I8`` (or ``U8``) [N, K / 2]: two FP4
  E2M1 codes a byte, the low nibble first (value 2j low, 2j + 1 high) (or the same bytes as
  torch's ``float4_e2m1fn_x2``, safetensors' ``F4``, whose header lists [N, K]), with
  ``X.scale`` [N, ceil(K / 32)], one per 32 values of a row (MXFP4's group); value = E2M1 *
  scale.
- Scales are ``F8_E8M0`` (``scale_fmt`` "ue8m0": powers of two) or ``F32`` ("float"). (A
  checkpoint with ``expert_dtype`` "fp8", as V4-Flash-Base's is said to be, has FP8 experts with
  float32 scales: read as any FP8 matrix.)

`check` refuses a quantized matrix whose scales are missing or misshapen in one line;
`Dequantized` serves every matrix in float32, dequantized on access (the engine casts it to its
dtype), so the engine and its weights estimate (`held_tensors`) hold what a 16/32-bit
checkpoint gives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pagoda.runtime.model.mxfp4 import FP4_VALUES

FP8, FP4 = "F8_E4M3", "I8"
FP4_KINDS = (FP4, "U8", "F4")  # [N, K / 2] bytes, or torch's float4_e2m1fn_x2 (listed [N, K])
SCALE_KINDS = ("F8_E8M0", "F32")
GROUP = 32  # FP4 values a scale
_SCALES = ("scale", "weight_scale_inv", "weight_scale")  # the files' name, transformers', vLLM's
_CODES = (torch.float8_e4m3fn, torch.int8, torch.uint8, torch.float4_e2m1fn_x2)


@dataclass(frozen=True)
class Dsv4Quant:
    """config.json's ``quantization_config`` (module docstring)."""

    block: tuple[int, int]
    expert_fp4: bool


def read(cfg: Mapping[str, Any]) -> Dsv4Quant | None:
    """The checkpoint's quantization; None for a 16/32-bit one; ValueError, one line, for a
    quantization DeepSeek-V4 is not released in."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return None
    if qc.get("quant_method") != "fp8" or qc.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn"):
        raise ValueError(f"config.json quantization_config: quant_method {qc.get('quant_method')!r}"
                         f" fmt {qc.get('fmt')!r} is not DeepSeek-V4's (fp8, e4m3)")  # fmt: skip
    if qc.get("scale_fmt", "float") not in ("float", "ue8m0"):
        raise ValueError(f"config.json quantization_config scale_fmt {qc['scale_fmt']!r} is "
                         "neither 'float' nor 'ue8m0'")  # fmt: skip
    expert = qc.get("expert_dtype", cfg.get("expert_dtype", "fp8"))
    if expert not in ("fp8", "fp4"):
        raise ValueError(f"config.json expert_dtype {expert!r} is neither 'fp8' nor 'fp4'")
    block = qc.get("weight_block_size") or [128, 128]
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ValueError(f"config.json quantization_config weight_block_size {block!r} is not "
                         "two positive integers")  # fmt: skip
    return Dsv4Quant((block[0], block[1]), expert == "fp4")


def scale_of(name: str, names) -> str | None:
    """The scales' name of matrix ``name`` (``X.weight``) among ``names``; None if none."""
    base = name.removesuffix("weight")
    return next((base + s for s in _SCALES if base + s in names), None)


def is_scale(name: str, names) -> bool:
    """Whether ``name`` is a quantized matrix's scales (``X.scale`` beside ``X.weight``)."""
    return any(name.endswith("." + s) and name.removesuffix(s) + "weight" in names
               for s in _SCALES)  # fmt: skip


def held_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A stored matrix's shape as the engine holds it (FP4's packed columns unpacked)."""
    return (*shape[:-1], shape[-1] * 2) if kind in (FP4, "U8") else tuple(shape)  # (F4: as listed)


def check(q: Dsv4Quant | None, name: str, stored: str, shape: tuple[int, ...],
          headers: Mapping[str, tuple[str, list[int]]], want: tuple[int, ...]) -> None:  # fmt: skip
    """Matrix ``stored`` (read as ``name``, expected ``want``) and its scales: ValueError, one
    line, where a quantized one lacks its scales or they (or it) are misshapen."""
    kind = headers[stored][0]
    if kind not in (FP8, *FP4_KINDS):
        if tuple(shape) != want:
            raise ValueError(f"checkpoint tensor {stored} is {list(shape)}, config.json gives "
                             f"{list(want)}")  # fmt: skip
        return
    if q is None:
        raise ValueError(f"checkpoint tensor {stored} is {kind}, but config.json has no "
                         "quantization_config")  # fmt: skip
    fp4 = kind in FP4_KINDS
    if fp4 and not (q.expert_fp4 and ".mlp.experts." in name):
        raise ValueError(f"checkpoint tensor {stored} is {kind}: only the routed experts are "
                         "FP4 (expert_dtype 'fp4')")  # fmt: skip
    if held_shape(kind, tuple(shape)) != want:
        raise ValueError(f"checkpoint tensor {stored} is {kind} {list(shape)}, config.json gives "
                         f"{list(want)}" + (" (two FP4 values a byte)" if fp4 else ""))  # fmt: skip
    n, k = want
    grid = (n, -(-k // GROUP)) if fp4 else (-(-n // q.block[0]), -(-k // q.block[1]))
    scale = scale_of(stored, headers)
    if scale is None:
        raise ValueError(f"checkpoint tensor {stored} is {kind} without its scales "
                         f"{stored.removesuffix('weight')}scale")  # fmt: skip
    s_kind, s_shape = headers[scale]
    if tuple(s_shape) != grid or s_kind not in SCALE_KINDS:
        what = "one per 32 values of a row" if fp4 else f"one per {q.block[0]}x{q.block[1]} tile"
        raise ValueError(f"checkpoint tensor {scale} is {s_kind} {list(s_shape)}; the {kind} "
                         f"matrix {list(shape)} needs {list(grid)} ({what}) in "
                         f"{' or '.join(SCALE_KINDS)}")  # fmt: skip


def dequantize_fp8(
    codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """``[N, K]`` E4M3 codes times their tiles' scales, in float32."""
    (n, k), (bn, bk) = codes.shape, block
    s = scale.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return codes.float() * s


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[N, K / 2]`` packed E2M1 codes (low nibble first) times their groups' scales, float32."""
    u8 = packed.view(torch.uint8)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=packed.device)
    values = torch.stack([lut[(u8 & 0x0F).long()], lut[(u8 >> 4).long()]], dim=-1).flatten(-2)
    s = scale.float().repeat_interleave(GROUP, 1)[:, : values.shape[1]]
    return values * s


class Dequantized(Mapping):
    """The checkpoint's tensors (canonical names) with every quantized matrix dequantized to
    float32 on access and the scales left out (what the engine reads)."""

    def __init__(
        self, weights: Mapping[str, torch.Tensor], q: Dsv4Quant | None, device: torch.device
    ) -> None:
        self._w, self.q, self.device = weights, q, device

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._w[name]
        if t.dtype not in _CODES or self.q is None:
            return t
        # the codes and scales moved first: dequantized on the device, one matrix at a time
        t, scale = t.to(self.device), self._w[scale_of(name, self._w)].to(self.device)
        if t.dtype != torch.float8_e4m3fn:
            return dequantize_fp4(t, scale)
        return dequantize_fp8(t, scale, self.q.block)

    def __contains__(self, name: object) -> bool:
        return name in self._w

    def __iter__(self) -> Iterator[str]:
        return iter(self._w)

    def __len__(self) -> int:
        return len(self._w)


def held_tensors(tensors: dict) -> dict:
    """The weights estimate's listing (`server/weights.py`: name -> `Stored`) as the engine
    holds it: a quantized matrix at its dequantized shape (counted in the engine's dtype), its
    scales and the MTP layers (``mtp.``: not read) left out."""
    import dataclasses

    out = {}
    for name, t in tensors.items():
        if name.removeprefix("model.").startswith("mtp.") or is_scale(name, tensors):
            continue
        if t.kind in (FP8, *FP4_KINDS) and scale_of(name, tensors) is not None:
            shape = held_shape(t.kind, t.shape)
            t = dataclasses.replace(t, kind="F32", shape=shape, nbytes=4 * math.prod(shape))
        out[name] = t
    return out
