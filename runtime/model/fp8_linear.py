"""A linear layer whose weight is FP8 (E4M3): `pagoda.kernels.fp8_linear` on every call.

Built by the model loader (`llama.linear_layer`) for the decoder's projections when the engine
runs FP8 (`pagoda.runtime.quantization.fp8`): the weight ``[N, K]`` is E4M3 with one float32 scale
per output channel, quantized at load (``--quantization fp8``) or read from an FP8 checkpoint.
Activations are quantized per token inside the call (dynamic), or with the checkpoint's static
per-tensor ``input_scale``, or not at all (a weight-only checkpoint: W8A16). The GEMM's launch
config depends on ``(N, K)`` alone, so a row's bits never depend on the rest of the batch (the
engine's batch invariance holds in FP8 too), and it has no host syncs (CUDA graphs capture it).

Same call surface as `linear.Linear` where the model reads it (``__call__``, ``argmax``,
``fuses_sampling``, ``fast``/``packed``/``weight``/``bias``), so the model code does not care
which one a layer got. The LM head and the embeddings stay 16-bit (vLLM does the same).
"""

from __future__ import annotations

import torch
from pagoda.runtime.quantization.fp8 import Fp8LinearWeights
from pagoda.runtime.sampling.ops import argmax_rows


class Fp8Linear:
    """``y = x @ dequant(weight).T + bias`` for 2-D 16-bit ``x``, in the FP8 GEMM."""

    __slots__ = ("_gemm", "bias", "input_scale", "weight", "weight_only", "weight_scale")
    fast = None  # no CPU kernel binding (`linear.Linear.fast`)
    packed = None
    fuses_sampling = False

    def __init__(
        self, weights: Fp8LinearWeights, bias: torch.Tensor | None, *, weight_only: bool = False
    ) -> None:
        if weight_only and weights.input_scale is not None:
            raise ValueError("a weight-only FP8 layer takes no input_scale")
        self.weight = weights.weight.contiguous()
        self.weight_scale = weights.weight_scale.contiguous()
        self.input_scale = weights.input_scale
        self.weight_only = weight_only
        self.bias = None if bias is None else bias.contiguous()
        from pagoda.kernels import fp8_linear  # here: a CPU-only install never needs Triton

        self._gemm = fp8_linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._gemm(
            x=x.contiguous(),
            weight=self.weight,
            weight_scale=self.weight_scale,
            x_scale=self.input_scale,
            bias=self.bias,
            weight_only=self.weight_only,
        )

    @property
    def nbytes(self) -> int:
        """Bytes a call reads of the weight and its scales."""
        return self.weight.numel() + 4 * self.weight_scale.numel()

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        return argmax_rows(self(x))

    def sample(self, x, scale, u):
        raise ValueError("an FP8 layer does not sample from its outputs")
