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

On tensor-parallel ranks (`bitnet.py`) each matrix is unpacked or quantized whole, then cut:
q/k/v and gate/up by rows (their inputs whole on every rank), o_proj and down_proj by input
columns, whose activations round by the whole row's absmax (`RowParallelBitLinear`).
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


def quantize_activations(
    x: torch.Tensor, row_max: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """Per-row absmax int8 rounding of `x`, in `x`'s dtype: transformers' `ActQuant.forward`
    op for op (``127 / t`` is torch's reciprocal times 127, as there). `row_max`: the whole
    rows' absmax [T, 1] from this part's (a row-parallel layer's input columns)."""
    f = x.float()
    amax = f.abs().amax(dim=-1, keepdim=True)
    scale = 127 / (amax if row_max is None else row_max(amax)).clamp_(min=1e-5)
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


class RowParallelBitLinear(BitLinear):
    """A BitLinear over this tensor-parallel rank's input columns (o_proj, down_proj): the
    activations rounded by their whole rows' absmax (a gather of one float per token), the
    partial products summed over the ranks, then scaled: transformers' rounding exactly."""

    __slots__ = ("tp",)

    def __init__(self, linear, scale: torch.Tensor | None, tp) -> None:
        super().__init__(linear, scale)
        self.tp = tp

    def _row_max(self, amax: torch.Tensor) -> torch.Tensor:
        return self.tp.gather_columns(amax).amax(dim=-1, keepdim=True)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(self.linear(quantize_activations(x, self._row_max)))
        return y if self.scale is None else y * self.scale


def _matrix(w, name: str, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The whole matrix `name` as the layer multiplies by it, unpacked (offline, with its one
    scale) or quantized (online: the mean over the whole matrix, before any split)."""
    if mode == "online":
        return quantize_weight(w[name]), None
    scale_name = name.removesuffix("weight") + "weight_scale"
    if scale_name not in w:
        raise ValueError(f"checkpoint is missing tensor {scale_name!r} (a packed BitNet "
                         "matrix's scale)")  # fmt: skip
    scale = w[scale_name].reshape(-1)
    if scale.numel() != 1:
        raise ValueError(f"{scale_name} has {scale.numel()} elements; BitNet's is one")
    return unpack_ternary(w.stored[name].to(w.device), w.dtype), scale


def bit_linear(ctx, w, names: list[str], mode: str, rows=None):
    """The BitLinear over the checkpoint matrices `names` (stacked by rows, as q/k/v and
    gate/up are): `ctx.linear` (`llama.LayerContext`) over their unpacked (offline) or
    quantized (online) values; `w` the `DeviceWeights`. Mode "": the dense layer alone.
    `rows`: on a tensor-parallel rank, its [start, stop) rows of each matrix (column-parallel;
    each matrix unpacked or quantized whole, then cut)."""
    if not mode:
        from pagoda.runtime.model.llama import linear_layer
        from pagoda.runtime.model.parallel_linear import column_linear

        return linear_layer(ctx, w, names) if rows is None else column_linear(ctx, w, names, rows)
    parts, scales = [], []
    for i, name in enumerate(names):
        part, scale = _matrix(w, name, mode)
        if rows is not None:
            part = part[rows[i][0] : rows[i][1]]
        parts.append(part)
        if scale is not None:
            scales.append(scale.expand(part.shape[0]))
    weight = parts[0] if len(parts) == 1 and rows is None else torch.cat(parts)
    return BitLinear(ctx.linear(weight), torch.cat(scales).contiguous() if scales else None)


def row_bit_linear(ctx, w, name: str, mode: str):
    """The BitLinear of matrix `name` on this tensor-parallel rank: its input columns
    (`RowParallelBitLinear`; mode "": `parallel_linear.row_linear`)."""
    from pagoda.runtime.model.parallel_linear import row_linear

    if not mode:
        return row_linear(ctx, w, name)
    weight, scale = _matrix(w, name, mode)
    start, stop = ctx.tp.layout.even(weight.shape[1])
    scale = None if scale is None else scale.expand(weight.shape[0]).contiguous()
    return RowParallelBitLinear(ctx.linear(weight[:, start:stop].contiguous()), scale, ctx.tp)
