"""Kolibri 1 (`Kolibri1ForCausalLM`; its config in `kolibri1_config.py`): GLM-4.5's model
(`glm4_moe.Glm4MoeModel`: DeepSeek's routed experts beside the ungated shared ones; the router
`moe_routing.GroupedRouter` with the bias on the logits) with GLM-4's layer (`glm4.Glm4Layer`:
norms on attention's and the MLP's outputs) and Qwen3's per-head q/k norms (`qwen3.Qwen3Layer`);
the window layers rotate, the full ones are NoPE (`FamilyConfig.rope_layers`)."""

from __future__ import annotations

from pagoda.runtime.model.glm4 import Glm4Layer
from pagoda.runtime.model.glm4_moe import Glm4MoeModel
from pagoda.runtime.model.qwen3 import Qwen3Layer


class Kolibri1Layer(Glm4Layer, Qwen3Layer):
    """GLM-4's `__call__` and post-sublayer norms, Qwen3's q/k norms before rotary."""


class Kolibri1Model(Glm4MoeModel):
    layer_class = Kolibri1Layer
