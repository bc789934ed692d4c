"""BitNet b1.58's linear layers (`BitNetForCausalLM`): ternary weights, int8 activations.

transformers' `AutoBitLinear` (integrations/bitnet.py), which the published checkpoints name
(`quantization_config` {quant_method: bitnet, linear_class: autobitlinear}), computes

    y = F.linear(act_quant(x), W) [* weight_scale]

- ``act_quant``: per token (row), in float32, s = 127 / max|x| (at least 1e-5), x rounded to
  int8 steps: round(x * s).clamp(-128, 127) / s, back in the model's dtype;
- ``offline`` (microsoft/bitnet-b1.58-2B-4T): W is ternary {-1, 0, 1}, stored packed four
  values a byte (uint8 [out / 4, in]: stored row r holds rows r, r + out/4, r + out/2 and
  r + 3 out/4 in its bit pairs 0-1, 2-3, 4-5, 6-7, each value + 1), with one `weight_scale` per
  matrix multiplying the output;
- ``online`` (microsoft/bitnet-b1.58-2B-4T-bf16): W is the bf16 master weight quantized on the
  fly: m = 1 / mean|W| (float32), W = round(W * m).clamp(-1, 1) / m, in the model's dtype.

Here the weights are unpacked (or quantized) once at load: the offline matrices to ternary
values in the model's dtype (exact), the scale kept apart as a per-output-column vector
(multiplying after the GEMM, as transformers does: folding it into W would round once where
transformers rounds twice); the online ones to transformers' own {-a, 0, a} matrix, which
is its quantized weight exactly. The GEMM itself is then the engine's dense `Linear` (oneDNN's
packed weights on a CPU, cuBLAS or the batch-invariant kernel on CUDA): the layer costs one
dense matmul plus the activations' rounding, a few elementwise passes over the [T, in] input
(no per-token loop, no host sync).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

VALUES_PER_BYTE = 4  # ternary values packed in a uint8 (2 bits each)
MODES = ("offline", "online")  # `FamilyConfig.bitnet` ("": dense, no quantization_config)


def unpack_ternary(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [R, C] → [4R, C] values in {-1, 0, 1} of `dtype` (transformers' `unpack_weights`:
    bit pair i of stored row r is row i * R + r, stored as value + 1)."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"packed ternary weights must be 2-D uint8, got {packed.dtype} "
                         f"{list(packed.shape)}")  # fmt: skip
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8, device=packed.device).view(-1, 1, 1)
    codes = (packed.unsqueeze(0) >> shifts) & 3  # [4, R, C]
    return codes.reshape(-1, packed.shape[1]).to(dtype).sub_(1)


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """Per-row absmax int8 rounding of `x`, in `x`'s dtype: transformers' `ActQuant.forward`
    op for op (``127 / t`` is torch's reciprocal times 127, as there)."""
    f = x.float()
    scale = 127 / f.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-5)
    return (f * scale).round_().clamp_(-128, 127).div_(scale).to(x.dtype)


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """A master weight (in the model's dtype) as transformers' `WeightQuant` computes it:
    ternary times 1 / m, m = 1 / mean|W| over the whole matrix, in float32, then the dtype."""
    f = weight.float()
    scale = 1.0 / f.abs().mean().clamp_(min=1e-5)
    return (f * scale).round_().clamp_(-1, 1).div_(scale).to(weight.dtype)


class BitLinear:
    """``y = linear(quantize_activations(x)) [* scale]``: `linear` an engine `Linear` over the
    ternary (offline) or quantized (online) matrices, `scale` None or [N], one matrix's
    weight_scale repeated over its output columns (a fused q/k/v or gate/up has one each)."""

    __slots__ = ("linear", "scale")

    def __init__(self, linear: Callable[[torch.Tensor], torch.Tensor], scale: torch.Tensor | None):
        self.linear, self.scale = linear, scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(quantize_activations(x))
        return y if self.scale is None else y * self.scale

    def linears(self) -> list:
        return [self.linear]


def bit_linear(ctx, w, names: list[str], mode: str):
    """The BitLinear over the checkpoint matrices `names` (stacked by rows, as q/k/v and
    gate/up are): `ctx.linear` (`llama.LayerContext`) over their unpacked (offline) or
    quantized (online) values; `w` the `DeviceWeights`. Mode "": the dense layer alone."""
    if not mode:
        from pagoda.runtime.model.llama import linear_layer

        return linear_layer(ctx, w, names)
    if mode == "online":
        weight = torch.cat([quantize_weight(w[n]) for n in names])
        return BitLinear(ctx.linear(weight), None)
    parts, scales = [], []
    for name in names:
        packed = w.stored[name]
        scale_name = name.removesuffix("weight") + "weight_scale"
        if scale_name not in w:
            raise ValueError(f"checkpoint is missing tensor {scale_name!r} (a packed BitNet "
                             "matrix's scale)")  # fmt: skip
        scale = w[scale_name].reshape(-1)
        if scale.numel() != 1:
            raise ValueError(f"{scale_name} has {scale.numel()} elements; BitNet's is one")
        part = unpack_ternary(packed.to(w.device), w.dtype)
        parts.append(part)
        scales.append(scale.expand(part.shape[0]))
    weight = parts[0] if len(parts) == 1 else torch.cat(parts)
    return BitLinear(ctx.linear(weight), torch.cat(scales).contiguous())
