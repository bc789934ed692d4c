"""BitNet b1.58 (`BitNetForCausalLM`: microsoft/bitnet-b1.58-2B-4T and its -bf16 master weights).

Llama's layer with BitLinear projections (`bitlinear.py`: ternary weights, int8 activations;
`FamilyConfig.bitnet` says whether the checkpoint stores them packed, "offline", or as bf16
master weights quantized at load, "online"; without a quantization_config, "", transformers
runs them as plain dense matrices, and so does this) and two more RMSNorms (transformers'
`BitNetAttention`, `BitNetMLP`):

- attention's output normalised (`self_attn.attn_sub_norm`) before o_proj;
- the MLP ``down(ffn_sub_norm(act(gate(x)) * up(x)))`` (`mlp.ffn_sub_norm`), act its
  hidden_act: relu² in BitNetConfig and the published checkpoints.

The embeddings and the LM head stay in the model's dtype (transformers leaves lm_head out of
the conversion). ``--quantization fp8`` is refused (`start_checks.check_dtype`).

Tensor parallel as Llama's: a rank's heads' rows of q/k/v and its rows of gate/up, o_proj and
down_proj row-parallel (`bitlinear.RowParallelBitLinear`: the activations rounded by the whole
row's absmax); each sub-norm over its whole width, a rank's channels of it normalised by every
rank's sum of squares (one all-reduce of a float per token).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.bitlinear import BitLinear, bit_linear, row_bit_linear
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.ops import rotary_interleaved


def _inner(layer):
    """The engine `Linear` under a BitLinear (or the layer itself, unquantized)."""
    return layer.linear if isinstance(layer, BitLinear) else layer


def _out_layer(ctx: LayerContext, w: DeviceWeights, name: str, mode: str):
    """o_proj or down_proj: whole, or this rank's input columns (`row_bit_linear`)."""
    return (
        bit_linear(ctx, w, [name], mode) if ctx.tp is None else row_bit_linear(ctx, w, name, mode)
    )


def sub_norm(ctx: LayerContext, x: torch.Tensor, weight: torch.Tensor, width: int):
    """RMSNorm of rows `x` over their whole `width` (as `ops.rms_norm`: rounded, then scaled):
    on a tensor-parallel rank `x` and `weight` are its channels, the mean square every rank's."""
    if ctx.tp is None:
        return ctx.rms_norm(x=x, weight=weight, eps=ctx.eps)
    xf = x.float()
    squares = ctx.tp.all_reduce(xf.square().sum(-1, keepdim=True))
    return (xf * torch.rsqrt(squares / width + ctx.eps)).to(x.dtype) * weight


def _norm_part(model: LlamaModel, w: DeviceWeights, name: str, ctx: LayerContext, per: int = 1):
    """Sub-norm `name`'s weight: whole, or this rank's channels (its heads' or rows' share)."""
    if ctx.tp is None:
        return model.read_norm(w, name)
    start, stop = ctx.tp.layout.even(w.length(name, 0) // per)
    return model.norm_weight(w.part(name, 0, start * per, stop * per))


class BitNetMLP:
    """down(ffn_sub_norm(act(gate(x)) * up(x))), gate and up one BitLinear."""

    __slots__ = ("ctx", "down", "gate_up", "sub_norm", "width")

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        mode, gate_up = (
            model.config.family.bitnet,
            [prefix + "gate_proj.weight", prefix + "up_proj.weight"],
        )
        self.ctx, self.width = ctx, model.config.intermediate_size
        rows = None if ctx.tp is None else [ctx.tp.layout.even(self.width)] * 2
        self.gate_up = bit_linear(ctx, w, gate_up, mode, rows)
        self.down = _out_layer(ctx, w, prefix + "down_proj.weight", mode)
        self.sub_norm = _norm_part(model, w, prefix + "ffn_sub_norm.weight", ctx)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ctx.act_and_mul(x=self.gate_up(x))  # relu(gate)² * up (`ops.relu2_and_mul`)
        return self.down(sub_norm(self.ctx, h, self.sub_norm, self.width))

    def linears(self) -> list:
        return [_inner(self.gate_up), _inner(self.down)]


class BitNetLayer(LlamaLayer):
    """Llama's layer over BitLinear projections, attention's output normalised before o_proj."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:  # (LlamaLayer's, its linear layers BitLinear)
        c, a, mode = model.config, prefix + "self_attn.", model.config.family.bitnet
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        qkv = [f"{a}{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        rows = None
        if ctx.tp is not None:  # this rank's query heads and KV heads (`parallel_linear`)
            lay, d = ctx.tp.layout, c.head_dim
            (q0, q1), (k0, k1) = lay.heads(c.num_heads), lay.kv_heads(c.num_kv_heads)
            rows = [(q0 * d, q1 * d)] + [(k0 * d, k1 * d)] * 2
        self.qkv = bit_linear(ctx, w, qkv, mode, rows)
        self.o_proj = _out_layer(ctx, w, a + "o_proj.weight", mode)
        self.sub_norm = _norm_part(model, w, a + "attn_sub_norm.weight", ctx, c.head_dim)
        self.width = c.num_heads * c.head_dim
        self.kv_scales = model.kv_scales(w, a.rstrip("."))  # an FP8 KV cache's (k, v) scales
        self.window, self.chunk = c.family.window(index), c.family.chunk(index)
        self.rope = model.rope_table(index)
        self.rotary = rotary_interleaved if c.family.rope_interleaved else ctx.ops.rotary_embedding
        self.mlp = BitNetMLP(model, w, prefix + "mlp.", ctx)

    def linears(self) -> list:
        return [_inner(self.qkv), _inner(self.o_proj), *self.mlp.linears()]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return sub_norm(self.ctx, out, self.sub_norm, self.width)


class BitNetModel(LlamaModel):
    layer_class = BitNetLayer
