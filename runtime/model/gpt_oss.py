"""gpt-oss (`GptOssForCausalLM`: openai/gpt-oss-20b and -120b): the Llama layer with what
differs, as transformers' `modeling_gpt_oss.py` computes it.

- attention sinks: one learned logit per head (`self_attn.sinks`) that joins each softmax's
  denominator only (the attention backends' ``sinks``: the torch path and the Triton kernels;
  the CPU's native kernel takes none, so a model with sinks leaves it for the torch path);
- q/k/v/o biases, head_dim 64 whatever hidden / heads, sliding-window layers (128 keys)
  alternating with full ones (`layer_types`), a YaRN rotary (`truncate` false);
- RMSNorm scaling in float32 before rounding once (Gemma's `gemma_rms_norm` with w itself);
- a mixture of experts in every layer (`GptOssMoE`): the router (with a bias) picks the top-k
  logits and softmaxes over them; each expert's gate/up and down have biases, and its activation
  is the clamped SwiGLU ``(up + 1) * gate * sigmoid(alpha * gate)``, gate <= limit,
  |up| <= limit (`swiglu_oai`).

Experts are stored stacked: `experts.gate_up_proj` [E, hidden, 2I] with gate and up interleaved
(columns 0::2 and 1::2) and `experts.down_proj` [E, I, hidden], multiplied as x @ W; the
published checkpoints hold them in MXFP4 (`*_blocks` and `*_scales`, `mxfp4.py`), dequantized
at load. Either way they become the engine's layout here: gate rows then up rows [E, 2I, hidden]
and down [E, hidden, I], as the other experts (`moe.py`) and the fused-MoE kernel take them.

In bf16 the softmax and its sink run in float32, as every attention here (and vLLM's);
transformers' eager gpt-oss attention softmaxes in the model's dtype, so in bf16 the two differ
by more than either differs from float32 (on the tests' tiny model: transformers' bf16 logits
0.27 from float32, ours 0.01).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from pagoda.runtime.model import mxfp4
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.moe import _fused_kernel, grouped_experts
from pagoda.runtime.model.ops import gemma_rms_norm


def swiglu_oai(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's expert activation of ``x`` [n, 2I] (gate columns, then up), in x's dtype:
    ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, g = min(gate, limit)."""
    gate, up = x.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def expert_tensors(
    w: DeviceWeights, prefix: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's experts in the engine's layout: (gate_up [E, 2I, H] gate rows then up rows,
    its bias [E, 2I] likewise, down [E, H, I], its bias [E, H]) from the checkpoint's stacked
    interleaved tensors, in bf16/float32 or MXFP4 (`mxfp4.read_experts`); or a GGUF's, already
    in that layout: `gate`/`up` (or `gate_up`, gate rows then up) and `down`, with biases
    (`gguf_archs`)."""
    if prefix + "down.weight" in w:  # a GGUF's
        if prefix + "gate_up.weight" in w:
            gate_up, bias = w[prefix + "gate_up.weight"], w[prefix + "gate_up.bias"]
        else:
            gate_up = torch.cat([w[prefix + "gate.weight"], w[prefix + "up.weight"]], dim=1)
            bias = torch.cat([w[prefix + "gate.bias"], w[prefix + "up.bias"]], dim=1)
        return gate_up, bias, w[prefix + "down.weight"], w[prefix + "down.bias"]
    if mxfp4.stored(w, prefix):
        gate_up, down = mxfp4.read_experts(w, prefix)  # [E, 2I, H] interleaved, [E, H, I]
    else:
        gate_up = w[prefix + "gate_up_proj"].transpose(1, 2)
        down = w[prefix + "down_proj"].transpose(1, 2).contiguous()
    gate_up = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1).contiguous()
    bias = w[prefix + "gate_up_proj_bias"]
    bias = torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1).contiguous()
    return gate_up, bias, down, w[prefix + "down_proj_bias"]


def fused_kernel(device: torch.device):
    """The fused-MoE kernel where the experts run in it (CUDA), else None (the CPU's grouped
    `Linear`s)."""
    return _fused_kernel() if device.type == "cuda" else None


class GptOssMoE:
    """Router + experts of one layer (module docstring). CPU: grouped by expert, the dense
    layers' `Linear`s with their biases (`moe.grouped_experts`); CUDA: the fused-MoE kernel
    with the experts' biases and ``swiglu_oai`` in its epilogues. Tensor parallel: each rank
    holds columns of every expert's intermediate width (gate and up rows, down columns), as
    `moe.SparseMoE`, and down's bias is added by rank 0 alone before the ranks' sum."""

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        f = model.config.family
        p = prefix + "mlp."
        router = p + "router.weight"  # 16-bit as every router (never the FP8 GEMM), its bias
        self.router = ctx.linear(w[router], w.biases([router]), quantized=w.quantized([router]))
        self.top_k, self.tp = f.num_experts_per_tok, ctx.tp
        self.alpha, self.limit = f.swiglu_alpha, f.swiglu_limit
        self.batch_invariant = ctx.batch_invariant
        gate_up, b13, down, b2 = expert_tensors(w, p + "experts.")
        if ctx.tp is not None:  # this rank's intermediate columns of every expert
            n = f.moe_intermediate_size
            a, b = ctx.tp.layout.even(n)
            gate_up = torch.cat([gate_up[:, a:b], gate_up[:, n + a : n + b]], dim=1).contiguous()
            b13 = torch.cat([b13[:, a:b], b13[:, n + a : n + b]], dim=1).contiguous()
            down = down[:, :, a:b].contiguous()
            b2 = b2 if ctx.tp.rank == 0 else torch.zeros_like(b2)  # added once in the sum
        self.fused = fused_kernel(w.device)
        self.experts: list[tuple[Linear, Linear]] = []
        if self.fused is not None:
            self.w13, self.b13, self.w2, self.b2 = gate_up, b13, down, b2
        else:
            self.experts = [
                (ctx.linear(gate_up[e], b13[e]), ctx.linear(down[e], b2[e]))
                for e in range(f.num_experts)
            ]

    def linears(self) -> list[Linear]:
        return [self.router, *(x for pair in self.experts for x in pair)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.partial(x)
        return out if self.tp is None else self.tp.all_reduce(out)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """The experts' output before the ranks' sum (tensor parallel: this rank's part)."""
        logits, ids = torch.topk(self.router(x), self.top_k, dim=-1)
        # softmax over the top-k logits, in the router's dtype (as transformers)
        weights = torch.softmax(logits.float(), dim=-1).to(x.dtype).float()
        if self.fused is not None:
            return self.fused(
                x, self.w13, self.w2, weights, ids.to(torch.int32),
                batch_invariant=self.batch_invariant, activation="swiglu_oai",
                w13_bias=self.b13, w2_bias=self.b2, alpha=self.alpha, limit=self.limit,
            )  # fmt: skip
        return grouped_experts(x, weights, ids, self._expert)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.experts[e]
        return down(swiglu_oai(gate_up(rows), self.alpha, self.limit))


def read_sinks(model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext) -> torch.Tensor:
    """Layer `prefix`'s attention sinks, float32 [heads] (this rank's heads' with tensor
    parallelism): gpt-oss's, and Flint's (`flint.py`)."""
    sinks = w[prefix + "self_attn.sinks"].float()
    if ctx.tp is not None:  # this rank's heads' sinks (a copy: not the whole's view)
        start, stop = ctx.tp.layout.heads(model.config.num_heads)
        sinks = sinks[start:stop].clone()
    return sinks.contiguous()


class GptOssLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.sinks = read_sinks(model, w, prefix, ctx)


class GptOssModel(LlamaModel):
    layer_class = GptOssLayer

    def layer_context(self, linear: Callable[..., Linear]) -> LayerContext:
        ctx = super().layer_context(linear)
        # (w * norm(x)) in float32, rounded once; for a float32 model that is `ops.rms_norm`
        norm = ctx.rms_norm if self.dtype == torch.float32 else gemma_rms_norm
        return dataclasses.replace(ctx, rms_norm=norm)

    def norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """float32, as transformers keeps gpt-oss's norms (`_keep_in_fp32_modules`)."""
        return weight if self.dtype == torch.float32 else weight.float()

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return GptOssMoE(self, w, prefix, ctx)
