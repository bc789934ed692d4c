"""Hybrid models: Mamba2 layers among attention layers (`FamilyConfig.mamba`; configs read in
`mamba_config.py`).

- Granite 4.0 (`granitemoehybrid`): Granite's layer and multipliers (`granite.py`), each layer's
  mixer a Mamba2 one (`mamba2.Mamba2Mixer`) or attention (NoPE unless the config says "rope");
  the MLP is the `shared_mlp` (gate and up in one `input_linear`), plus top-k experts
  (`block_sparse_moe`, GraniteMoe's) beside it where `num_local_experts` > 0.
- Bamba (`bamba`): the same layer without the multipliers, a dense `feed_forward` MLP after
  `pre_ff_layernorm`, rotary on half of each head.

The Mamba layers read their recurrent state slots (conv, SSM; `worker/mamba_state.py`) and the
step's slots from `meta.aux["mamba"]` (`mamba2.MambaStep`); their entries of the step's
`kv_caches` are empty (no KV cache).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.granite import GraniteModel, SharedMLP
from pagoda.runtime.model.llama import GatedMLP, LayerContext, LlamaLayer, Step
from pagoda.runtime.model.mamba2 import MAMBA_STEP, Mamba2Mixer
from pagoda.runtime.model.moe import SharedExpertMoE, SparseMoE
from pagoda.runtime.model.parallel_linear import RowParallelLinear
from pagoda.runtime.model.recurrent_layer import RecurrentLayer

BAMBA_FINAL_NORM = "model.final_layernorm.weight"  # Bamba's name for `model.norm`


class HybridLayer(RecurrentLayer, LlamaLayer):
    """x + mixer(norm(x)), then + mlp(norm(x)), each branch times `residual_multiplier`
    (Granite's; 1 for Bamba); the mixer a Mamba2 one (`recurrent_layer.RecurrentLayer`) or
    attention, by layer."""

    mixer: Mamba2Mixer | None = None

    def __init__(
        self, model: GraniteModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        c = model.config
        norm = "pre_ff_layernorm" if c.architecture == "bamba" else "post_attention_layernorm"
        self.mlp_norm_name = f"{norm}.weight"
        super().__init__(model, w, prefix, index, ctx)
        if self.mixer is None:  # attention: Llama's
            self.mlp_norm = model.read_norm(w, prefix + self.mlp_norm_name)
        self.scale = c.family.residual_multiplier

    def make_mixer(
        self, model: GraniteModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> Mamba2Mixer:
        c = model.config
        return Mamba2Mixer(c.family.mamba, w, prefix, index, c.rms_norm_eps, ctx)

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.attention_input(h, residual)  # h: the last MLP's, already scaled
        if self.mixer is None:
            h = self.attention(x, step)
        else:
            h = self.mixer(x, step.meta.aux[MAMBA_STEP])
        if self.scale != 1.0:
            h = h * self.scale
        x, residual = self.ctx.rms_norm(x=h, weight=self.mlp_norm, eps=self.ctx.eps,
                                        residual=residual)  # fmt: skip
        out = self.mlp(x)
        return (out * self.scale if self.scale != 1.0 else out), residual


class HybridModel(GraniteModel):
    """Granite 4.0 and Bamba (module docstring). Granite's embedding and logits scales are 1.0
    for Bamba."""

    layer_class = HybridLayer
    # GraniteMoe's stacked experts and router (`moe.SparseMoE`)
    moe_names = ("block_sparse_moe.", ("input_linear", "output_linear"))
    moe_router, moe_experts = "router.layer.weight", ""

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        if self.config.architecture == "bamba":
            return GatedMLP(ctx, w, prefix + "feed_forward.")
        shared = SharedMLP(ctx, w, prefix + "shared_mlp.")
        if not self.config.family.num_experts:
            return shared
        if isinstance(shared.down, RowParallelLinear):  # its partial sum joins the experts'
            shared.down = shared.down.inner  # (one all-reduce for both)
        return SharedExpertMoE(SparseMoE.from_weights(self, w, prefix, ctx), shared, None)

    def read_norm(self, w: DeviceWeights, name: str) -> torch.Tensor:
        if name == "model.norm.weight" and self.config.architecture == "bamba":
            name = BAMBA_FINAL_NORM
        return super().read_norm(w, name)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.config.family.embedding_multiplier == 1.0:
            return super(GraniteModel, self).embed_tokens(input_ids)
        return super().embed_tokens(input_ids)
