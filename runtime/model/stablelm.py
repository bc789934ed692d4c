"""StableLM (`StableLmForCausalLM`: stablelm-3b-4e1t, StableLM 2 1.6B / 12B, stable-code-3b):
Llama's layer and SwiGLU MLP over StarCoder2's norms (`starcoder2.py`: LayerNorm with a weight
and a bias, in the model's dtype; eps `layer_norm_eps`), with

- a partial rotary (`partial_rotary_factor`, default 0.25) in the rotate-half layout;
- biases on q, k and v where `use_qkv_bias` says;
- with `qk_layernorm` (StableLM 2 12B), a LayerNorm without bias over each head of q and of k,
  a weight per head (`self_attn.q_layernorm.norms.{h}.weight`, stacked [heads, head_dim]; a rank
  holds its heads' rows), scaled in float32 and rounded once as `cohere.CohereLayer`'s;
- with `use_parallel_residual` (StableLM 2 12B), attention and the MLP side by side off one
  norm, ``x + attn(n) + mlp(n)`` (`cohere.CohereLayer.__call__`; `FamilyConfig.falcon_norms`
  "one"), else Llama's layer.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.cohere import CohereLayer
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel, Step
from pagoda.runtime.model.starcoder2 import Starcoder2Model


def per_head_norm(w: DeviceWeights, name: str, heads: tuple[int, int]) -> torch.Tensor:
    """[heads, head_dim] float32: the weights `name` (with `{h}`) of heads [start, stop)."""
    return torch.stack([w[name.format(h=h)] for h in range(*heads)]).float()


class StableLmLayer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        c, a, tp = model.config, prefix + "self_attn.", ctx.tp
        self.parallel = c.family.falcon_norms == "one"
        self.q_norm = self.k_norm = None
        if c.family.qk_norm:  # this rank's heads' rows
            heads = (0, c.num_heads) if tp is None else tp.layout.heads(c.num_heads)
            kv = (0, c.num_kv_heads) if tp is None else tp.layout.kv_heads(c.num_kv_heads)
            self.q_norm = per_head_norm(w, a + "q_layernorm.norms.{h}.weight", heads)
            self.k_norm = per_head_norm(w, a + "k_layernorm.norms.{h}.weight", kv)

    before_rotary = CohereLayer.before_rotary  # LayerNorm over each head, a weight per head

    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.parallel:
            return CohereLayer.__call__(self, h, residual, step)
        return LlamaLayer.__call__(self, h, residual, step)


class StableLmModel(Starcoder2Model):
    layer_class = StableLmLayer
    make_mlp = LlamaModel.make_mlp  # (SwiGLU: not StarCoder2's ungated MLP)
