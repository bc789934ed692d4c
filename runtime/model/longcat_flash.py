"""LongCat-Flash (`LongcatFlashForCausalLM`: meituan-longcat/LongCat-Flash-Chat), as transformers'
modeling_longcat_flash.py computes it, run as ``2 * num_layers`` sublayers
(`longcat_flash_config`: the tensors listed under the sublayers' names):

- each sublayer is DeepSeek-V3's (`deepseek.DeepseekLayer`): latent attention (the absorbed
  form, one latent row cached per token, its own KV cache) then a dense SwiGLU MLP, each behind
  its RMSNorm. LongCat's LoRA scales, q's sqrt(hidden / q_lora_rank) (the whole query, nope and
  rotary dims) and the latent's sqrt(hidden / kv_lora_rank) (after its norm: keys' unrotated
  part and values alike), are folded into the two bottleneck norms' weights at load (the q_b
  projection is linear, the latent is read only through W_UK and W_UV);
- the **shortcut MoE**: layer l's first sublayer (2l) also runs the experts on the input of its
  MLP, and their output is added after the second sublayer's MLP, as transformers' ``residual +
  mlps[1](x) + shortcut`` (carried across in `Step.shortcut`);
- **zero-computation experts**: the router (`moe_routing.GroupedRouter`: float32 softmax over
  ``n_routed_experts + zero_expert_num``, the choice with the correction bias, weights not
  renormalised, times ``routed_scaling_factor``) may pick a zero expert, which returns its input:
  ``x * sum(weights of the zero picks)``, one elementwise product. Those picks go to the routed
  experts (`moe.SparseMoE.mix`) as id -1, which the fused kernel leaves out of its grouped GEMMs
  (`kernels/fused_moe.py` ``none_ids``) and the CPU path skips: a zero expert costs nothing but
  its routing. transformers sends them to a real expert with weight 0: the same sum.

Tensor parallel (`distributed/layout.py`): each sublayer's latent attention by heads
(`deepseek.py`), its dense MLP and the routed experts by width (one all-reduce each, the zero
experts' identity added once after the experts' sum), the router replicated. ``--quantization
fp8`` is refused in one line (`family_options`).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.deepseek import DeepseekLayer, DeepseekModel
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaModel, Step
from pagoda.runtime.model.longcat_flash_config import lora_scales
from pagoda.runtime.model.moe import SparseMoE


class ZeroExpertMoE:
    """The routed experts beside ``zero_experts`` identity experts (module docstring)."""

    def __init__(self, routed: SparseMoE, num_experts: int) -> None:
        self.routed, self.num_experts = routed, num_experts

    def linears(self) -> list[Linear]:
        return self.routed.linears()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.routed.route(x)  # float32 [T, k], [T, k] over real + zero experts
        zero = ids >= self.num_experts
        identity = x * weights.masked_fill(~zero, 0.0).sum(dim=-1, keepdim=True)
        out = self.routed.run_experts(x, weights.masked_fill(zero, 0.0), ids.masked_fill(zero, -1),
                              none_ids=True)  # fmt: skip
        if self.routed.tp is not None:  # this rank's widths' part, summed before the identity
            out = self.routed.tp.all_reduce(out)
        return out + identity.to(out.dtype)


class LongcatFlashLayer(DeepseekLayer):
    """One sublayer (module docstring): DeepSeek's, the LoRA scales folded in, the shortcut
    MoE started in an even sublayer and added in the odd one."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        q_scale, kv_scale = lora_scales(model.config)
        self.q_norm = self.q_norm * q_scale
        self.kv_norm = self.kv_norm * kv_scale
        self.shortcut = None
        if index % 2 == 0:
            routed = SparseMoE.from_weights(model, w, prefix, ctx)
            self.shortcut = ZeroExpertMoE(routed, model.config.family.num_experts)

    def linears(self):
        return [*super().linears(), *([] if self.shortcut is None else self.shortcut.linears())]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        h = self.attention(x, step)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        if self.shortcut is not None:
            step.shortcut = self.shortcut(x)
            return self.mlp(x), residual
        # transformers' (residual + mlps[1](x)) + shortcut: the stream takes the MLP's output
        return step.shortcut, residual + self.mlp(x)


class LongcatFlashModel(DeepseekModel):
    """LongCat-Flash's sublayers (module docstring)."""

    layer_class = LongcatFlashLayer
    moe_names = ("moe.", ("gate_proj", "up_proj", "down_proj"))
    moe_router = "router.classifier.weight"
    moe_bias = "router.e_score_correction_bias"

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return GatedMLP(ctx, w, prefix + "mlp.")
