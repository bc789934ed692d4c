"""PhiMoE (`PhimoeForCausalLM`, the hub's `PhiMoEForCausalLM`: Phi-3.5-MoE-instruct), as
transformers runs it: Mixtral's layer with LayerNorms (a weight and a bias, eps `rms_norm_eps`:
StarCoder2's `layer_norm`) for its RMSNorms, q/k/v/o biases where `attention_bias` says, an LM
head bias where `lm_head_bias` says, a sliding window on every layer where `sliding_window`
says, LongRoPE with PhiMoE's own attention factors (`short_mscale` / `long_mscale`); experts
in every layer (`block_sparse_moe.experts.{e}.w1/w3/w2`, the fused kernel on CUDA) picked by
sparsemixer (`moe_routing.sparsemixer`: two experts, each weighted by a softmax over the logits
near it).
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.starcoder2 import Starcoder2Model


class PhimoeModel(Starcoder2Model):
    moe_names = ("block_sparse_moe.", ("w1", "w3", "w2"))
    make_mlp = make_mlp
    head_bias: torch.Tensor | None = None

    def __init__(self, config, weights, **kwargs) -> None:
        super().__init__(config, weights, **kwargs)
        if "lm_head.bias" in weights:  # whole on every rank: added after the vocabulary gather
            w = DeviceWeights(weights, self.device, self.dtype, {}, None,
                              kwargs.get("check_weights", True))  # fmt: skip
            self.head_bias = w["lm_head.bias"]
            w.check_finite(self.tp)

    def head_blocks(self, w: DeviceWeights, head: str):
        return None if "lm_head.bias" in w else super().head_blocks(w, head)

    def logits(self, x, head):
        if self.head_bias is None:
            return super().logits(x, head)
        return self.lm_head(x) + self.head_bias
