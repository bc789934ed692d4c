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
the conversion). Tensor parallelism and ``--quantization fp8`` are refused (`layout.check`,
`start_checks.check_dtype`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.bitlinear import BitLinear, bit_linear
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.ops import rotary_interleaved


def _inner(layer):
    """The engine `Linear` under a BitLinear (or the layer itself, unquantized)."""
    return layer.linear if isinstance(layer, BitLinear) else layer


class BitNetMLP:
    """down(ffn_sub_norm(act(gate(x)) * up(x))), gate and up one BitLinear."""

    __slots__ = ("ctx", "down", "gate_up", "sub_norm")

    def __init__(self, model: LlamaModel, w: DeviceWeights, prefix: str, ctx: LayerContext):
        mode = model.config.family.bitnet
        self.ctx = ctx
        self.gate_up = bit_linear(ctx, w, [prefix + "gate_proj.weight", prefix + "up_proj.weight"],
                                  mode)  # fmt: skip
        self.down = bit_linear(ctx, w, [prefix + "down_proj.weight"], mode)
        self.sub_norm = model.read_norm(w, prefix + "ffn_sub_norm.weight")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ctx.act_and_mul(x=self.gate_up(x))  # relu(gate)² * up (`ops.relu2_and_mul`)
        return self.down(self.ctx.rms_norm(x=h, weight=self.sub_norm, eps=self.ctx.eps))

    def linears(self) -> list:
        return [_inner(self.gate_up), _inner(self.down)]


class BitNetLayer(LlamaLayer):
    """Llama's layer (one device: no tensor parallelism) over BitLinear projections, attention's
    output normalised before o_proj."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:  # (LlamaLayer's, its linear layers BitLinear)
        c, a, mode = model.config, prefix + "self_attn.", model.config.family.bitnet
        self.ctx, self.index = ctx, index
        self.attn_norm = model.read_norm(w, prefix + "input_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "post_attention_layernorm.weight")
        qkv = [f"{a}{n}.weight" for n in ("q_proj", "k_proj", "v_proj")]
        self.qkv = bit_linear(ctx, w, qkv, mode)
        self.o_proj = bit_linear(ctx, w, [a + "o_proj.weight"], mode)
        self.sub_norm = model.read_norm(w, a + "attn_sub_norm.weight")
        self.kv_scales = model.kv_scales(w, a.rstrip("."))  # an FP8 KV cache's (k, v) scales
        self.window, self.chunk = c.family.window(index), c.family.chunk(index)
        self.rope = model.rope_table(index)
        self.rotary = rotary_interleaved if c.family.rope_interleaved else ctx.ops.rotary_embedding
        self.mlp = BitNetMLP(model, w, prefix + "mlp.", ctx)

    def linears(self) -> list:
        return [_inner(self.qkv), _inner(self.o_proj), *self.mlp.linears()]

    def attention_output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return self.ctx.rms_norm(x=out, weight=self.sub_norm, eps=self.ctx.eps)


class BitNetModel(LlamaModel):
    layer_class = BitNetLayer

    def __init__(self, config, weights, **kwargs) -> None:
        if kwargs.get("tp") is not None:
            raise ValueError("a BitNet model is not split over tensor-parallel ranks")
        super().__init__(config, weights, **kwargs)
