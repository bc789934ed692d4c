"""ERNIE 4.5 (`Ernie4_5ForCausalLM`: ERNIE-4.5-0.3B): Llama's layer with the rotary in the
interleaved layout, pairs (2i, 2i + 1) (`ops.rotary_interleaved`, `FamilyConfig.rope_interleaved`),
in float32 throughout as transformers' (`rotary_float32`): cos and sin stay float32 (the rows
are gathered in float32, not the model's dtype), q and k are widened, rotated and rounded once.
`use_bias` puts biases on q, k, v, o and the MLP's three matrices (read where the checkpoint has
them, as Llama's).

ERNIE 4.5 MoE (`Ernie4_5_MoeForCausalLM`: ERNIE-4.5-21B-A3B, -300B-A47B): the same attention,
dense MLPs outside `moe_layer_start_index`..`moe_layer_end_index` (every `moe_layer_interval`-th
layer), experts elsewhere: a float32 softmax router whose top-k is chosen with the correction
bias added (`moe_statics.e_score_correction_bias`, [1, E]) and weighted by the uncorrected
probabilities, renormalised and rounded to the model's dtype (`moe_routing.GroupedRouter`,
greedy), beside ungated shared experts of `moe_intermediate_size x moe_num_shared_experts`.
"""

from __future__ import annotations

import functools

import torch
from pagoda.runtime.model import moe_names, ops
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.moe import make_mlp
from pagoda.runtime.model.ops import rotary_interleaved

rotary_float32 = functools.partial(ops.rotary_float32, rotary_interleaved)


class Ernie4_5Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.rotary = rotary_float32


class Ernie4_5Model(LlamaModel):
    layer_class = Ernie4_5Layer

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        return super()._rope_rows(positions, torch.float32, meta)  # cos and sin in float32


_NAMES = moe_names.of("ernie4_5_moe")


class Ernie4_5MoeModel(Ernie4_5Model):
    moe_names = (_NAMES.block, _NAMES.experts)
    moe_bias = _NAMES.bias
    make_mlp = make_mlp
