"""Idefics3 and SmolVLM (`Idefics3ForConditionalGeneration`, `SmolVLMForConditionalGeneration`):
a SigLIP-style vision tower over square tiles (`siglip_vision.py`), the connector (each
`scale_factor` x `scale_factor` block of patches shuffled into one row, then the
`modality_projection` matrix), and a Llama text model (this family's `LlamaModel`).

`encode_images` turns a batch of preprocessed tiles into the rows that replace each tile's
`<image>` placeholders (the runner scatters them: `worker/mm_encoder.py`, `llama.IMAGE_EMBEDS`).
Every tile is the tower's full square, so transformers' patch mask is all ones; its positions
are the ones `Idefics3VisionEmbeddings` buckets for a full grid (`_position_ids`, computed once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.llava import tower_and_projection
from pagoda.runtime.model.siglip_vision import SiglipVisionTower

# stored prefix -> this module's (transformers 4's and 5's names, with or without `model.`)
_TOWER = ("model.vision_model.", "vision_model.")
_CONNECTOR = ("model.connector.modality_projection.", "connector.modality_projection.")


def _position_ids(side: int) -> torch.Tensor:
    """The position of each patch of a full `side` x `side` grid as `Idefics3VisionEmbeddings`
    buckets it (float32 fractional coordinates: not always the identity)."""
    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    coords = torch.arange(side, dtype=torch.float32) * (1.0 / torch.tensor(float(side)))
    buckets = torch.bucketize(torch.clamp(coords, max=1.0 - 1e-6), boundaries, right=True)
    return (buckets[:, None] * side + buckets[None, :]).reshape(-1)


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[N, side², D] → [N, side² / scale², D * scale²] (`Idefics3Connector.pixel_shuffle`)."""
    n, seq, d = x.shape
    side = round(seq**0.5)
    x = x.view(n, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(n, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(n, seq // scale**2, d * scale**2)


class Idefics3Model(LlamaModel):
    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        vision = self.config.vision
        if vision is None:
            raise ValueError("an Idefics3 model needs its vision_config and a tokenizer.json "
                             "with its image tokens")  # fmt: skip
        want = (self.config.hidden_size, vision.hidden_size * vision.scale_factor**2)
        label = "connector's modality_projection.proj.weight"
        self.tower, self.projection = tower_and_projection(
            self, w, (_TOWER, _CONNECTOR), self._tower, ("proj.weight", label, want)
        )

    def _tower(self, tensors: dict[str, torch.Tensor]) -> SiglipVisionTower:
        """The SigLIP tower, its positions as a full tile's buckets read them."""
        vision = self.config.vision
        tower = SiglipVisionTower(tensors, vision)
        side = vision.image_size // vision.patch_size
        tower.positions = tower.positions[_position_ids(side).to(self.device)]
        return tower

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] preprocessed tiles → [N, tokens_per_image, hidden] features."""
        h = self.tower(pixel_values)  # [N, patches, D]
        return F.linear(pixel_shuffle(h, self.config.vision.scale_factor), self.projection)
