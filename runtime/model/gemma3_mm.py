"""Gemma 3 with image input (`Gemma3ForConditionalGeneration` with its `vision_config`): a
SigLIP tower (`siglip_vision.py`), `Gemma3MultiModalProjector` (the patch grid average-pooled
to `mm_tokens_per_image` rows, Gemma's (1 + w) RMSNorm, a matmul by
`mm_input_projection_weight`), and Gemma 3's text model (`gemma3.py`).

`encode_images` gives the rows that replace the prompt's `<image_soft_token>` placeholders
(the runner scatters them: `worker/mm_encoder.py`, `llama.IMAGE_EMBEDS`; Gemma's embedding
scale is not applied to them, as transformers'). Each image's tokens attend to each other both
ways in prefill (`attention.base.IMAGE_SPANS`, the scheduler keeps an image in one chunk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.gemma3 import Gemma3Model
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.llava import _PROJECTOR, _TOWER, _strip
from pagoda.runtime.model.siglip_vision import SiglipVisionTower


class Gemma3VisionModel(Gemma3Model):
    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)
        vision = self.config.vision
        self.tower = None
        if self.tp is not None and self.tp.rank > 0:  # rank 0 encodes; features broadcast
            return
        stored = w.stored
        if not hasattr(stored, "tensors_under"):
            raise ValueError("a Gemma 3 model's vision tower is read from safetensors files")
        tower, projector = {}, {}
        for name, t in stored.tensors_under(_TOWER + _PROJECTOR).items():
            p = _strip(name, _PROJECTOR)
            if p is not None:
                projector[p] = t.to(self.device)
            elif not (p := _strip(name, _TOWER)).startswith("head."):  # (its unused pooling head)
                tower[p] = t.to(self.device)
        try:
            self.tower = SiglipVisionTower({k: t.to(self.dtype) for k, t in tower.items()}, vision)
            self.soft_norm = projector["mm_soft_emb_norm.weight"].float()
            self.projection = projector["mm_input_projection_weight"].to(self.dtype)
        except KeyError as e:
            raise ValueError(
                f"the Gemma 3 checkpoint lacks the vision tensor {e.args[0]!r}"
            ) from None
        if tuple(self.projection.shape) != (vision.hidden_size, self.config.hidden_size):
            raise ValueError(f"mm_input_projection_weight is {list(self.projection.shape)}, "
                             f"not [{vision.hidden_size}, {self.config.hidden_size}]")  # fmt: skip

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] preprocessed pixels → [N, mm_tokens_per_image, hidden] features."""
        vision = self.config.vision
        h = self.tower(pixel_values)  # [N, patches, D]
        n, _, d = h.shape
        grid = vision.image_size // vision.patch_size
        kernel = grid // round(vision.pooled_tokens**0.5)
        x = h.transpose(1, 2).reshape(n, d, grid, grid)
        x = F.avg_pool2d(x, kernel, kernel).flatten(2).transpose(1, 2)  # [N, tokens, D]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + vision.layer_norm_eps)
        x = (xf * (1.0 + self.soft_norm)).to(x.dtype)
        return torch.matmul(x, self.projection)
