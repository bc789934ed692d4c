"""CLIP's vision tower (transformers' `CLIPVisionModel`), inference only, batched over images:
patch embedding (a strided convolution), the class token and learned positions, a pre-norm,
then pre-norm encoder layers (bidirectional SDPA attention, an MLP of `hidden_act`).

It hands back `hidden_states[k]` (the input of layer k; `k` = the layers it has: the last
layer's output), which is what LLaVA reads (`vision_feature_layer`); the post-norm and the
layers after `k` are never run. Other towers (SigLIP's for Gemma 3) are the same shape of class:
`__call__(pixel_values [N, 3, H, W]) -> [N, rows, hidden]`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pagoda.runtime.multimodal.config import VisionConfig


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    """`hidden_act` by its `multimodal.config` name."""
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    return F.gelu(x, approximate="tanh" if name == "gelu_tanh" else "none")


class ClipEncoderLayer:
    __slots__ = ("act", "eps", "fc1", "fc2", "heads", "ln1", "ln2", "out", "qkv")

    def __init__(self, w: Mapping[str, torch.Tensor], prefix: str, cfg: VisionConfig) -> None:
        a = prefix + "self_attn."
        self.eps, self.heads, self.act = cfg.layer_norm_eps, cfg.num_heads, cfg.hidden_act
        self.ln1 = (w[prefix + "layer_norm1.weight"], w[prefix + "layer_norm1.bias"])
        self.ln2 = (w[prefix + "layer_norm2.weight"], w[prefix + "layer_norm2.bias"])
        self.qkv = tuple(
            torch.cat([w[f"{a}{p}_proj.{k}"] for p in "qkv"]) for k in ("weight", "bias")
        )
        self.out = (w[a + "out_proj.weight"], w[a + "out_proj.bias"])
        self.fc1 = (w[prefix + "mlp.fc1.weight"], w[prefix + "mlp.fc1.bias"])
        self.fc2 = (w[prefix + "mlp.fc2.weight"], w[prefix + "mlp.fc2.bias"])

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        x = F.layer_norm(h, (d,), *self.ln1, self.eps)
        q, k, v = F.linear(x, *self.qkv).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)  # [N, heads, T, D]: no mask (all see all)
        h = h + F.linear(o.transpose(1, 2).reshape(n, t, d), *self.out)
        x = F.layer_norm(h, (d,), *self.ln2, self.eps)
        return h + F.linear(activation(self.act, F.linear(x, *self.fc1)), *self.fc2)


class ClipVisionTower:
    """`w`: the tower's tensors by transformers' names under the vision model
    (`embeddings.patch_embedding.weight`, `encoder.layers.0....`, `pre_layrnorm.weight`), on
    the device in the model's dtype."""

    def __init__(self, w: Mapping[str, torch.Tensor], cfg: VisionConfig) -> None:
        self.cfg = cfg
        self.patch = w["embeddings.patch_embedding.weight"]  # [D, 3, p, p]
        self.cls = w["embeddings.class_embedding"]  # [D]
        self.positions = w["embeddings.position_embedding.weight"]  # [1 + patches, D]
        if self.positions.shape[0] != cfg.num_patches + 1:
            raise ValueError(f"vision tower: {self.positions.shape[0]} positions for "
                             f"{cfg.num_patches} patches and the class token")  # fmt: skip
        self.pre_norm = (w["pre_layrnorm.weight"], w["pre_layrnorm.bias"])
        self.layers = [
            ClipEncoderLayer(w, f"encoder.layers.{i}.", cfg) for i in range(cfg.layers_run)
        ]

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] → `hidden_states[feature_layer]` [N, 1 + patches, D]."""
        cfg = self.cfg
        x = pixel_values.to(self.patch.dtype)
        x = F.conv2d(x, self.patch, stride=cfg.patch_size).flatten(2).transpose(1, 2)
        cls = self.cls.expand(x.shape[0], 1, -1)
        h = torch.cat([cls, x], dim=1) + self.positions
        h = F.layer_norm(h, (h.shape[-1],), *self.pre_norm, cfg.layer_norm_eps)
        for layer in self.layers:
            h = layer(h)
        return h
