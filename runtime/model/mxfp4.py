"""MXFP4 expert weights (gpt-oss's published checkpoints, `quantization_config.quant_method`
"mxfp4"), dequantized at load to the engine's dtype.

Each stacked expert matrix `{name}` [E, rows, cols] is stored as `{name}_blocks` uint8
[E, rows, cols / 32, 16] (two FP4 E2M1 values a byte, the low nibble first) and `{name}_scales`
uint8 [E, rows, cols / 32] (an E8M0 exponent, bias 127, for each 32 values of a row): value =
FP4 * 2 ** (scale - 127), exact in bf16 and float32. The rows are the matrix's outputs (gate_up:
2I interleaved gate/up rows over hidden; down: hidden rows over I), so the dequantized matrix is
what x @ W.T needs, the transpose of the bf16 checkpoints' `gate_up_proj` [E, hidden, 2I]
(transformers' `convert_moe_packed_tensors`, which transposes after it). `quantize` is the
inverse (the round to the nearest E2M1 of each 32-value block over its power-of-two scale),
for tests that pack a model's experts.
"""

from __future__ import annotations

import torch

BLOCK = 32  # values per scale
BIAS = 127  # E8M0's exponent bias
# E2M1 codes 0..15: sign bit 3, then 2 exponent bits and 1 mantissa bit
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # fmt: skip
NAMES = ("gate_up_proj", "down_proj")


def stored(w, prefix: str) -> bool:
    """Whether the experts under `prefix` are stored in MXFP4."""
    return prefix + "gate_up_proj_blocks" in w


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[..., G, 16]`` uint8 blocks and ``[..., G]`` uint8 scales → ``[..., G * 32]`` values in
    `dtype` (module docstring), on the blocks' device."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")  # fmt: skip
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not fit scales "
                         f"{tuple(scales.shape)} (want [..., G, 16] and [..., G])")  # fmt: skip
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    low, high = lut[(blocks & 0x0F).int()], lut[(blocks >> 4).int()]
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., G, 32], low nibble first
    exp = scales.to(device=blocks.device, dtype=torch.int32).sub_(BIAS).unsqueeze(-1)
    return torch.ldexp(values, exp).to(dtype).flatten(-2)


def read_experts(w, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, 2I, hidden] rows interleaved gate/up, down [E, hidden, I]) of the experts
    under `prefix`, dequantized on the device in its dtype, one expert at a time (the uint8
    codes of one expert are the only temporaries beside the result)."""
    out = []
    for name in NAMES:
        blocks, scales = w.stored[f"{prefix}{name}_blocks"], w.stored[f"{prefix}{name}_scales"]
        e, rows, groups, _ = blocks.shape
        full = torch.empty(e, rows, groups * BLOCK, dtype=w.dtype, device=w.device)
        for i in range(e):
            full[i] = dequantize(blocks[i].to(w.device), scales[i].to(w.device), w.dtype)
        out.append(w.finite.add(f"{prefix}{name}_blocks", full))  # (an E8M0 of 255: NaN)
    return out[0], out[1]


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., cols]`` float values (cols a multiple of 32) → (blocks uint8 [..., cols / 32, 16],
    scales uint8 [..., cols / 32]): each block's scale the smallest power of two that brings its
    largest magnitude within 6.0, each value rounded to the nearest E2M1 (ties to the lower
    code). The inverse of `dequantize` for values it produced."""
    x = x.float()
    g = x.shape[-1] // BLOCK
    blocks = x.reshape(*x.shape[:-1], g, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-BIAS, 127)
    scaled = blocks / torch.exp2(exp)
    mags = torch.tensor(FP4_VALUES[:8])
    code = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)  # nearest magnitude
    code = code + 8 * (scaled < 0).long()
    pairs = code.reshape(*code.shape[:-1], BLOCK // 2, 2).to(torch.uint8)
    packed = pairs[..., 0] | (pairs[..., 1] << 4)
    return packed, (exp.squeeze(-1) + BIAS).to(torch.uint8)
