"""Apertus (`ApertusForCausalLM`: Apertus-8B, 70B): Qwen3's layer (an RMSNorm over each head
of q and of k before rotary) with

- its norms named `attention_layernorm` (before attention) and `feedforward_layernorm`
  (before the MLP) where Llama's are `input_layernorm` and `post_attention_layernorm`;
- an ungated MLP, ``down(xielu(up(x)))`` (`ungated_mlp.UngatedMLP`), xIELU's parameters per
  layer from the checkpoint (`mlp.act_fn.alpha_p`, `alpha_n`, `beta`, `eps`);
- llama3 rotary scaling by default (transformers' ApertusConfig, when config.json names none).

Apertus 1.5's text model (`Apertus1p5TextForCausalLM`, `Apertus1p5Model`) is Apertus' with
a larger vocabulary (visual and audio codes) and its LM head pruned to the text ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.qwen3 import Qwen3Layer
from pagoda.runtime.model.ungated_mlp import UngatedMLP

if TYPE_CHECKING:
    from pagoda.runtime.sampling.sampler import HeadSampling


class ApertusLayer(Qwen3Layer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.attn_norm = model.read_norm(w, prefix + "attention_layernorm.weight")
        self.mlp_norm = model.read_norm(w, prefix + "feedforward_layernorm.weight")


class ApertusModel(LlamaModel):
    layer_class = ApertusLayer

    def make_mlp(self, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext):
        return UngatedMLP(ctx, w, prefix + "mlp.", self.config.family.hidden_act)


class Apertus1p5Model(ApertusModel):
    """Apertus 1.5's text model (`Apertus1p5TextForCausalLM`): Apertus', its LM head pruned to
    the vocabulary's first `FamilyConfig.head_rows` ids (`output_vocab_size`: the text ids;
    the embedding keeps the visual and audio codes' rows too). The logits stay as wide as the
    vocabulary, which every request check and sampling table is sized by: the pruned ids'
    columns are -inf, so no sampler draws them and the softmax over the rest is transformers'
    over its narrower logits."""

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        rows = config.family.head_rows
        self.pruned = config.vocab_size - rows if rows else 0
        self.vocab_size = config.vocab_size  # (the logits' width: `logits`)

    def logits(self, x: torch.Tensor, head: HeadSampling | None) -> torch.Tensor:
        if self.pruned and head is not None:  # (a float head: never fused, `qgemm` only)
            raise ValueError("a pruned LM head does not sample from its outputs")
        out = super().logits(x, head)
        return F.pad(out, (0, self.pruned), value=float("-inf")) if self.pruned else out
