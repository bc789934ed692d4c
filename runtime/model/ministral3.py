"""Ministral 3 (`Ministral3ForCausalLM`, and the text model of the `Mistral3ForConditionalGeneration`
checkpoints whose `text_config` says `ministral3`): Mistral's layer with Llama 4's query scale.

Each token's q is multiplied by ``1 + beta * log(1 + floor(p / context))`` at its position p
(`FamilyConfig.query_scale_beta`, `query_scale_context`: the rotary's
`original_max_position_embeddings`), so attention sharpens past each multiple of the original
context. transformers multiplies after rotary; rotary is linear, so scaling before it is the
same product (one rounding apart in 16 bits). The scales are worked out once a step from the
positions, as a [T, 1, 1] column beside the rotary rows.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model.llama import LlamaLayer, LlamaModel, Step

QUERY_SCALE = "query_scale"  # the key of this step's scales in `Step.rope`


class Ministral3Layer(LlamaLayer):
    def attention(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        self._scale = step.rope[QUERY_SCALE][1]
        return super().attention(x, step)

    def before_rotary(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q * self._scale, k


class Ministral3Model(LlamaModel):
    layer_class = Ministral3Layer

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        f = self.config.family
        rows = super()._rope_rows(positions, dtype, meta)
        steps = torch.floor(positions.float() / f.query_scale_context)
        scale = 1 + f.query_scale_beta * torch.log(1 + steps)
        rows[QUERY_SCALE] = (None, scale.to(dtype)[:, None, None])
        return rows
