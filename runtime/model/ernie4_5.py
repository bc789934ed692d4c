"""ERNIE 4.5 (`Ernie4_5ForCausalLM`: ERNIE-4.5-0.3B): Llama's layer with the rotary in the
interleaved layout, pairs (2i, 2i + 1) (`ops.rotary_interleaved`, `FamilyConfig.rope_interleaved`),
computed in float32 and rounded once as transformers' (`widen`, Cohere's). transformers keeps
cos and sin in float32 too, where the engine's rows are in the model's dtype: in float32 the
two are one, in 16 bits they can differ by the rounding of cos and sin. `use_bias` puts biases
on q, k, v, o and the MLP's three matrices (read where the checkpoint has them, as Llama's).
"""

from __future__ import annotations

import functools

from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaLayer, LlamaModel
from pagoda.runtime.model.ops import rotary_interleaved


class Ernie4_5Layer(LlamaLayer):
    def __init__(
        self, model: LlamaModel, w: DeviceWeights, prefix: str, index: int, ctx: LayerContext
    ) -> None:
        super().__init__(model, w, prefix, index, ctx)
        self.rotary = functools.partial(rotary_interleaved, widen=True)  # in float32, as HF


class Ernie4_5Model(LlamaModel):
    layer_class = Ernie4_5Layer
