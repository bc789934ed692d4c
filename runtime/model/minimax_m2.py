"""MiniMax-M2 (`MiniMaxM2ForCausalLM`: MiniMaxAI/MiniMax-M2, M2.1), as transformers runs it:
Llama's attention with q and k each RMS-normalised over the whole projection before rotary
(OLMo 2's `WholeQKNormLayer`, its sums all-reduced under tensor parallelism) and a partial
rotary in the rotate-half layout (`rotary_dim` of each head's dims); experts in every layer
(Mixtral's `block_sparse_moe.experts.{e}.w1/w3/w2`, the fused kernel on CUDA) picked by the
sigmoid of the router's logits plus a choice-only correction bias
(`block_sparse_moe.e_score_correction_bias`), weighted by the uncorrected scores renormalised
(`moe_routing.GroupedRouter`, greedy); no shared expert.
"""

from __future__ import annotations

from pagoda.runtime.model import moe_names
from pagoda.runtime.model.llama import LlamaModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.olmo2 import WholeQKNormLayer

_NAMES = moe_names.of("minimax_m2")


class MiniMaxM2Model(LlamaModel):
    layer_class = WholeQKNormLayer
    moe_names = (_NAMES.block, _NAMES.experts)
    moe_bias = _NAMES.bias
    make_mlp = make_mlp
