"""InternViT, InternVL's vision tower (transformers' `InternVLVisionModel`), inference only,
batched over square tiles: patch embedding (a strided convolution with a bias), the class
token, learned positions (the tower's own grid: tiles are never another size), then layers of

    h = h + lambda_1 * attention(norm_before(h))      (q/k RMSNorms over all heads, optional)
    h = h + lambda_2 * mlp(norm_after(h))             (fc1, GELU, fc2)

(LayerNorm or RMSNorm by `norm_type`), and a final LayerNorm where the tower does not mean-pool.
`__call__(pixel_values [N, 3, S, S]) -> [N, 1 + patches, D]` (`last_hidden_state`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pagoda.runtime.multimodal.internvl_config import InternVLVisionConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`InternVLVisionRMSNorm`: normalised in float32, cast back, then scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class _Norm:
    __slots__ = ("bias", "eps", "weight")

    def __init__(self, w: Mapping[str, torch.Tensor], name: str, eps: float, rms: bool) -> None:
        self.weight, self.eps = w[name + ".weight"], eps
        self.bias = None if rms else w[name + ".bias"]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return rms_norm(x, self.weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class InternVisionLayer:
    __slots__ = ("fc1", "fc2", "heads", "k_norm", "lambda_1", "lambda_2", "norm_after",
                 "norm_before", "out", "q_norm", "qkv")  # fmt: skip

    def __init__(self, w: Mapping[str, torch.Tensor], prefix: str, cfg: InternVLVisionConfig):
        a, eps, rms = prefix + "attention.", cfg.layer_norm_eps, cfg.rms_norm
        self.heads = cfg.num_heads
        self.norm_before = _Norm(w, prefix + "layernorm_before", eps, rms)
        self.norm_after = _Norm(w, prefix + "layernorm_after", eps, rms)
        weight = torch.cat([w[f"{a}{p}_proj.weight"] for p in "qkv"])
        bias = torch.cat([w[f"{a}{p}_proj.bias"] for p in "qkv"]) if cfg.attention_bias else None
        self.qkv = (weight, bias)
        self.out = (w[a + "projection_layer.weight"], w[a + "projection_layer.bias"])
        # (`InternVLVisionRMSNorm(embed_dim)`: its default eps, not the config's)
        self.q_norm = w[a + "q_norm.weight"] if cfg.qk_norm else None
        self.k_norm = w[a + "k_norm.weight"] if cfg.qk_norm else None
        self.fc1 = (w[prefix + "mlp.fc1.weight"], w[prefix + "mlp.fc1.bias"])
        self.fc2 = (w[prefix + "mlp.fc2.weight"], w[prefix + "mlp.fc2.bias"])
        self.lambda_1, self.lambda_2 = w[prefix + "lambda_1"], w[prefix + "lambda_2"]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        q, k, v = F.linear(self.norm_before(h), *self.qkv).split(d, dim=-1)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, 1e-6), rms_norm(k, self.k_norm, 1e-6)
        q, k, v = (x.view(n, t, self.heads, -1).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v)  # [N, heads, T, hd]: all see all
        h = h + self.lambda_1 * F.linear(o.transpose(1, 2).reshape(n, t, d), *self.out)
        x = F.gelu(F.linear(self.norm_after(h), *self.fc1))
        return h + self.lambda_2 * F.linear(x, *self.fc2)


class InternVisionTower:
    """`w`: the tower's tensors by transformers' names under the vision tower
    (`embeddings.cls_token`, `encoder.layer.0....`, `layernorm.weight`), on the device in the
    model's dtype."""

    def __init__(self, w: Mapping[str, torch.Tensor], cfg: InternVLVisionConfig) -> None:
        self.cfg = cfg
        self.patch = w["embeddings.patch_embeddings.projection.weight"]  # [D, 3, p, p]
        self.patch_bias = w["embeddings.patch_embeddings.projection.bias"]
        self.cls = w["embeddings.cls_token"].reshape(1, 1, -1)
        self.positions = w["embeddings.position_embeddings"].reshape(1, -1, cfg.hidden_size)
        if self.positions.shape[1] != cfg.num_patches + 1:
            raise ValueError(f"vision tower: {self.positions.shape[1] - 1} positions for "
                             f"{cfg.num_patches} patches")  # fmt: skip
        self.layers = [InternVisionLayer(w, f"encoder.layer.{i}.", cfg)
                       for i in range(cfg.num_layers)]  # fmt: skip
        self.final = (w["layernorm.weight"], w["layernorm.bias"]) if cfg.final_norm else None

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] → `last_hidden_state` [N, 1 + patches, D]."""
        x = F.conv2d(pixel_values.to(self.patch.dtype), self.patch, self.patch_bias,
                     stride=self.cfg.patch_size)  # fmt: skip
        x = x.flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for layer in self.layers:
            h = layer(h)
        if self.final is None:
            return h
        return F.layer_norm(h, (h.shape[-1],), *self.final, self.cfg.layer_norm_eps)
