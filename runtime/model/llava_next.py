"""LLaVA-NeXT and LLaVA-OneVision (`LlavaNextForConditionalGeneration`,
`LlavaOnevisionForConditionalGeneration`): LLaVA's tower and projector (`llava.py`; a CLIP
tower, or OneVision's SigLIP one read at `vision_feature_layer`), the learned `image_newline`,
and the text model (Llama's, Mistral's or Qwen2's layers: this family's `LlamaModel`).

An image arrives as its crops (`multimodal/anyres_processing.py`): the whole image resized to
one crop, then the crops of its grid. `encode_image_list` runs every crop of the step's new
images through the tower and projector in one batch, then per image joins the grid crops'
features into one feature map (`anyres_processing.layout`: the crops side by side), drops the
rows or columns of the padding, resizes it bilinearly where OneVision caps it, and appends the
newline embedding after each row: the base crop's rows, then the map's rows. The runner
scatters them over the image's placeholders (`worker/mm_encoder.py`). Under tensor
parallelism rank 0 alone holds the tower (LLaVA's): the features are broadcast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.clip_vision import ClipVisionTower
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.llava import LlavaModel
from pagoda.runtime.model.siglip_vision import SiglipVisionTower
from pagoda.runtime.multimodal.anyres_processing import Layout, layout
from pagoda.runtime.multimodal.config import VisionConfig

_NEWLINE = ("model.image_newline", "image_newline")


class LlavaNextModel(LlavaModel):
    ragged_images = True  # `mm_encoder.device_step`: each image's own crops, as a list

    def tower_config(self) -> VisionConfig:
        return self.config.vision.tower

    def build_tower(self, tensors: dict[str, torch.Tensor], vision: VisionConfig):
        if self.config.vision.siglip:
            return SiglipVisionTower(tensors, vision, layers=vision.layers_run)
        return ClipVisionTower(tensors, vision)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        super().read_model_tensors(w, ctx)
        if self.tower is None:  # (a rank other than 0)
            return
        found = w.stored.tensors_under(_NEWLINE)
        if len(found) != 1:
            raise ValueError("the checkpoint lacks the vision tensor 'image_newline'")
        self.newline = next(iter(found.values())).to(device=self.device, dtype=self.dtype)
        if tuple(self.newline.shape) != (self.config.hidden_size,):
            raise ValueError(f"image_newline is {list(self.newline.shape)}, not "
                             f"[{self.config.hidden_size}]")  # fmt: skip

    @torch.inference_mode()
    def encode_image_list(self, pixels: list[torch.Tensor], sizes: list) -> list[torch.Tensor]:
        """Each image's crops [1 + crops, 3, S, S] and (height, width) → its features
        [placeholders, hidden], every crop through the tower in one batch."""
        vision = self.config.vision
        feats = self.project(self.tower(torch.cat(pixels)))  # [crops, side², hidden]
        parts = feats.split([len(p) for p in pixels])
        return [self._pack(f, layout(*size, vision)) for f, size in zip(parts, sizes)]

    def _pack(self, f: torch.Tensor, lay: Layout) -> torch.Tensor:
        """One image's crops' features [1 + crops, side², D] → [base rows + rows x (cols +
        1), D] (transformers' `pack_image_features`)."""
        p = self.config.vision.side
        (gh, gw), d = lay.grid, f.shape[-1]
        if f.shape[0] != 1 + gh * gw or f.shape[1] != p * p:
            raise ValueError(f"image features {tuple(f.shape)} do not fit its {gh}x{gw} grid "
                             f"of {p}x{p} crops")  # fmt: skip
        g = f[1:].view(gh, gw, p, p, d).permute(4, 0, 2, 1, 3).reshape(d, gh * p, gw * p)
        g = g[:, lay.top : lay.bottom, lay.left : lay.right]
        if lay.resized:
            g = F.interpolate(g[None], list(lay.out), mode="bilinear")[0]
        newline = self.newline[:, None, None].expand(d, g.shape[1], 1)
        g = torch.cat([g, newline], dim=2).flatten(1).transpose(0, 1)
        return torch.cat([f[0], g])
