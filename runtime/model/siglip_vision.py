"""SigLIP's vision tower (transformers' `SiglipVisionModel` without its pooling head),
inference only, batched over images: patch embedding (a strided convolution with a bias),
learned positions (no class token), pre-norm encoder layers (CLIP's layer: `clip_vision.
ClipEncoderLayer`, bidirectional SDPA, here a gelu_pytorch_tanh MLP), then the post-norm.

`__call__(pixel_values [N, 3, H, W]) -> [N, patches, hidden]` (`last_hidden_state`), what
Gemma 3's projector pools (`model/gemma3_mm.py`); PaliGemma's reads the same. Built with
`layers=k` it hands back `hidden_states[k]` (the first k layers, no post-norm): what
LLaVA-OneVision's projector reads (`vision_feature_layer`, `model/llava_next.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pagoda.runtime.model.clip_vision import ClipEncoderLayer
from pagoda.runtime.multimodal.config import VisionConfig


class SiglipVisionTower:
    """`w`: the tower's tensors by transformers' names under the vision model
    (`embeddings.patch_embedding.weight`, `encoder.layers.0....`, `post_layernorm.weight`),
    on the device in the model's dtype."""

    def __init__(self, w: Mapping[str, torch.Tensor], cfg: VisionConfig,
                 layers: int | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.patch = w["embeddings.patch_embedding.weight"]  # [D, 3, p, p]
        self.patch_bias = w["embeddings.patch_embedding.bias"]  # [D]
        self.positions = w["embeddings.position_embedding.weight"]  # [patches, D]
        if self.positions.shape[0] != cfg.num_patches:
            raise ValueError(f"vision tower: {self.positions.shape[0]} positions for "
                             f"{cfg.num_patches} patches")  # fmt: skip
        self.post_norm = None  # `layers` given: hidden_states[layers], no post-norm
        if layers is None:
            self.post_norm = (w["post_layernorm.weight"], w["post_layernorm.bias"])
        n = cfg.num_layers if layers is None else layers
        self.layers = [ClipEncoderLayer(w, f"encoder.layers.{i}.", cfg) for i in range(n)]

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] → `last_hidden_state` [N, patches, D] (`hidden_states[layers]`)."""
        cfg = self.cfg
        x = pixel_values.to(self.patch.dtype)
        x = F.conv2d(x, self.patch, self.patch_bias, stride=cfg.patch_size)
        h = x.flatten(2).transpose(1, 2) + self.positions
        for layer in self.layers:
            h = layer(h)
        if self.post_norm is None:
            return h
        return F.layer_norm(h, (h.shape[-1],), *self.post_norm, cfg.layer_norm_eps)
