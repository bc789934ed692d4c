"""Qwen3-VL (`Qwen3VLForConditionalGeneration`) and Qwen3-VL-MoE
(`Qwen3VLMoeForConditionalGeneration`): Qwen3-VL's tower (`qwen3_vl_vision.py`) beside Qwen3's
text model (q/k norms; Qwen3-MoE's experts for the MoE), with Qwen2-VL's M-RoPE
(`qwen2_vl.py`) whose sections are interleaved, and DeepStack.

DeepStack: an image's feature rows hold its merged features and then one feature per
DeepStack block (`Qwen3VisionTower.encode`); the step's image rows take the first as their
embeddings, and text layer i's output at those rows has the (i+1)-th added (transformers'
`_deepstack_process`), for the first len(deepstack) layers. A step without image rows (a
decode, a text-only request, a chunk past its images) adds nothing: as transformers, whose
DeepStack reads the prompt's image rows once.
"""

from __future__ import annotations

import torch
from pagoda.runtime.model import moe
from pagoda.runtime.model.llama import IMAGE_EMBEDS, Step
from pagoda.runtime.model.qwen2_vl import Qwen2VLModel
from pagoda.runtime.model.qwen3 import Qwen3Layer
from pagoda.runtime.model.qwen3_vl_vision import Qwen3VisionTower

# `meta.aux`: (rows int64 [R], features [R, deepstack, hidden]): the step's image rows and
# what each of the first text layers adds to them
DEEPSTACK = "deepstack"


class Qwen3VLLayer(Qwen3Layer):
    def __call__(
        self, h: torch.Tensor, residual: torch.Tensor | None, step: Step
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = super().__call__(h, residual, step)
        stack = step.meta.aux.get(DEEPSTACK)
        if stack is not None and self.index < stack[1].shape[1]:
            # (the layer's output is h + residual: the next norm adds them)
            h = h.index_add(0, stack[0], stack[1][:, self.index])
        return h, residual


class Qwen3VLModel(Qwen2VLModel):
    layer_class = Qwen3VLLayer
    tower_class = Qwen3VisionTower
    name = "Qwen3-VL"

    @property
    def image_feature_width(self) -> int:
        """The merged features, then one row per DeepStack block, side by side."""
        return self.config.hidden_size * (1 + len(self.config.vision.deepstack))

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta, logits_indices, head=None):
        """`LlamaModel.forward`, the step's image features split: the merged ones replace the
        placeholders' embeddings, the DeepStack ones go to the first layers (`DEEPSTACK`)."""
        images = meta.aux.get(IMAGE_EMBEDS)
        hidden = self.config.hidden_size
        if images is not None and images[1].shape[1] > hidden:
            rows, feats = images
            meta.aux[IMAGE_EMBEDS] = (rows, feats[:, :hidden])
            meta.aux[DEEPSTACK] = (rows, feats[:, hidden:].view(len(rows), -1, hidden))
        return super().forward(input_ids, positions, kv_caches, meta, logits_indices, head)


class Qwen3VLMoeModel(Qwen3VLModel):
    """Qwen3-VL-MoE: Qwen3-MoE's experts (`moe.make_mlp`) in Qwen3-VL's text layers."""

    name = "Qwen3-VL-MoE"
    # every expert's matrices stacked (`moe_transposed`: as the hub stores them, [E, in, out];
    # else transformers 5's [E, out, in]), the router `gate`
    moe_names = ("mlp.", ("gate_up_proj", "down_proj"))
    moe_suffix, moe_transposed = "", True
    make_mlp = moe.make_mlp

    def read_model_tensors(self, w, ctx) -> None:
        super().read_model_tensors(w, ctx)
        f = self.config.family
        first = next(filter(f.has_experts, range(self.config.num_layers)), None)
        if first is not None:  # (transformers reads a down_proj of [E, h, N] as it is)
            down = f"model.layers.{first}.mlp.experts.down_proj"
            self.moe_transposed = w.length(down, 1) != self.config.hidden_size
