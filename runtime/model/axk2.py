"""A.X-K2 (`AXK2ForCausalLM`): DeepSeek-V3.2 (`dsa.DsaLayer`: latent attention, the lightning
indexer, V3's experts) with what transformers' modular_axk2.py changes:

- **gated norms**: the norm before attention, and the one before the MLP in the expert layers,
  are ``y * sigmoid(W_up(silu(W_down(y))))`` of their output ``y`` (`AXK2GatedRMSNorm`: a
  low-rank gate MLP, CLIP's, ``gated_norm_rank`` wide; the product in float32, as
  transformers), the checkpoint's ``<norm>.norm.weight``, ``<norm>.W_down.weight`` and
  ``<norm>.W_up.weight``; the dense layers' second norm is a plain RMSNorm;
- **the attention's output gate** (`MlaConfig.output_gate`, model/deepseek.py): ``q_b_proj``
  reads ``[normed | raw]`` q bottleneck and gives each head its query and a gate; each head's
  value is scaled by ``sigmoid(gate)`` before ``o_proj`` (the indexer reads the normed
  bottleneck, as V3.2's);
- **the router**: V3's noaux_tc with no expert groups unless ``n_group`` is set, the other
  groups' experts set to 0 rather than -inf (`ExpertRouting.zero_other_groups`); the MLP kinds
  by ``mlp_layer_types``, else from ``first_k_dense_replace`` (default 1) and
  ``moe_layer_freq``, as AXK2Config derives them.

Tensor parallelism is DeepSeek-V3.2's (the gate rows go with their head's query rows; the gated
norms' small matrices are whole on every rank); the refusals are V3.2's (model/dsa.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.dsa import DsaLayer, DsaModel
from pagoda.runtime.model.llama import LayerContext, LlamaModel, Step, linear_layer


class NormGate:
    """``y * sigmoid(W_up(silu(W_down(y))))`` (AXK2GatedRMSNorm's gate, after its RMSNorm)."""

    __slots__ = ("down", "up")

    def __init__(self, ctx: LayerContext, w: DeviceWeights, prefix: str) -> None:
        self.down = linear_layer(ctx, w, [prefix + "W_down.weight"])
        self.up = linear_layer(ctx, w, [prefix + "W_up.weight"])

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        return (y * torch.sigmoid(self.up(F.silu(self.down(y))).float())).to(y.dtype)

    def linears(self):
        return [self.down, self.up]


class Axk2Layer(DsaLayer):
    """DeepSeek-V3.2's layer with A.X-K2's gated norms (module docstring)."""

    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.attn_gate = NormGate(ctx, w, prefix + "input_layernorm.")
        post = prefix + "post_attention_layernorm."
        self.mlp_gate = NormGate(ctx, w, post) if post + "W_down.weight" in w else None

    def linears(self):
        gates = [self.attn_gate, *([self.mlp_gate] if self.mlp_gate else [])]
        return [*super().linears(), *(x for g in gates for x in g.linears())]

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)
        h = self.attention(self.attn_gate(x), step)
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        return self.mlp(x if self.mlp_gate is None else self.mlp_gate(x)), residual


class Axk2Model(DsaModel):
    """A.X-K2 (module docstring)."""

    layer_class = Axk2Layer

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        """A gated norm's RMSNorm weight is ``<norm>.norm.weight``."""
        gated = name.removesuffix("weight") + "norm.weight"
        return super().read_norm(w, gated if name not in w and gated in w else name)
