"""InternVL 3 / 3.5 in transformers' format (`InternVLForConditionalGeneration`): InternViT
(`internvl_vision.py`), the pixel shuffle (each 2 x 2 block of a tile's patch rows, the class
token dropped, one row of 4 x D: `InternVLModel.pixel_shuffle`), the projector (LayerNorm,
linear, GELU, linear), and the text model: Qwen2's layers (this family's `LlamaModel`, q/k/v
biases), Qwen3's (`qwen3.Qwen3Model`) or Qwen3-MoE's (`moe.Qwen3MoeModel`).

`encode_images` turns a batch of preprocessed tiles into the rows that replace each tile's
`<IMG_CONTEXT>` placeholders (the runner scatters them: `worker/mm_encoder.py`,
`llama.IMAGE_EMBEDS`). Under tensor parallelism rank 0 alone holds the tower and projector
(LLaVA's way): each step's image rows and features are broadcast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.internvl_vision import InternVisionTower
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.llava import _strip
from pagoda.runtime.model.moe import Qwen3MoeModel
from pagoda.runtime.model.qwen3 import Qwen3Model

# stored prefix -> this module's (transformers 5's names, and 4's without `model.`)
_TOWER = ("model.vision_tower.", "vision_tower.")
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")


def pixel_shuffle(x: torch.Tensor) -> torch.Tensor:
    """[N, side², D] → [N, side² / 4, 4D] (`InternVLModel.pixel_shuffle`, ratio 0.5)."""
    n, seq, d = x.shape
    side = round(seq**0.5)
    x = x.view(n, side, side // 2, d * 2).permute(0, 2, 1, 3)
    x = x.reshape(n, side // 2, side // 2, d * 4).permute(0, 2, 1, 3)
    return x.reshape(n, seq // 4, d * 4)


class InternVLImages:
    """Mixed in before the text model's class: the tower and projector, `encode_images`."""

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)  # type: ignore[misc]
        vision = self.config.vision
        if vision is None:
            raise ValueError("an InternVL model needs its vision_config and a tokenizer.json "
                             "with <img>, </img> and <IMG_CONTEXT>")  # fmt: skip
        self.tower = None
        if self.tp is not None and self.tp.rank > 0:  # rank 0 encodes; features broadcast
            return
        stored = w.stored
        if not hasattr(stored, "tensors_under"):
            raise ValueError("an InternVL model's vision tower is read from safetensors files")
        tower, projector = {}, {}
        for name, t in stored.tensors_under(_TOWER + _PROJECTOR).items():
            t = t.to(device=self.device, dtype=self.dtype)
            if (p := _strip(name, _PROJECTOR)) is not None:
                projector[p] = t
            elif (p := _strip(name, _TOWER)) is not None:
                tower[p] = t
        try:
            self.tower = InternVisionTower(tower, vision)
            self.projector = tuple((projector[f"{m}.weight"], projector[f"{m}.bias"])
                                   for m in ("layer_norm", "linear_1", "linear_2"))  # fmt: skip
        except KeyError as e:
            raise ValueError(
                f"the InternVL checkpoint lacks the vision tensor {e.args[0]!r}"
            ) from None
        want = (self.config.hidden_size, 4 * vision.hidden_size)
        if tuple(self.projector[1][0].shape) != want:
            raise ValueError(f"the projector's linear_1 is {list(self.projector[1][0].shape)}, "
                             f"not {list(want)}")  # fmt: skip

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] preprocessed tiles → [N, tokens_per_image, hidden] features."""
        h = pixel_shuffle(self.tower(pixel_values)[:, 1:])  # [N, patches / 4, 4D]
        norm, l1, l2 = self.projector
        h = F.layer_norm(h, (h.shape[-1],), *norm, 1e-5)
        return F.linear(F.gelu(F.linear(h, *l1)), *l2)


class InternVLModel(InternVLImages, LlamaModel):
    """InternVL with Qwen2's text model (InternVL3)."""


class InternVLQwen3Model(InternVLImages, Qwen3Model):
    """InternVL with Qwen3's text model (InternVL3.5)."""


class InternVLQwen3MoeModel(InternVLImages, Qwen3MoeModel):
    """InternVL with Qwen3-MoE's text model (InternVL3.5-30B-A3B, -241B-A28B)."""
