"""Llama 4's vision side (`Llama4ForConditionalGeneration`'s `vision_model` and
`multi_modal_projector`), inference only, batched over tiles, and the model that reads images
beside Llama 4's text model (`Llama4VisionModel`).

The tower as transformers' `Llama4VisionModel` runs it: each tile unfolded into patches and
embedded by one matrix (no bias), the class embedding appended after the patches, the learned
positions added, the pre-norm; pre-norm encoder layers (bidirectional attention with biases
whose q and k turn by a 2D rotary: each patch's column + 1 on the first half of the head's
pairs, its row + 1 on the other, the class token unturned; an exact-GELU MLP); the post-norm;
the class token dropped; each 2 x 2 block of patches shuffled into one row
(`idefics3.pixel_shuffle`), the adapter (fc1, GELU, fc2, GELU, no biases), then the projector
into the text model's width. LayerNorms use torch's default eps (1e-5), as transformers' do.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.idefics3 import pixel_shuffle
from pagoda.runtime.model.llama import LayerContext
from pagoda.runtime.model.llama4 import Llama4Model
from pagoda.runtime.model.llava import tower_and_projection
from pagoda.runtime.multimodal.llama4_vision_config import Llama4VisionConfig

_TOWER = ("vision_model.", "model.vision_model.")
_PROJECTOR = ("multi_modal_projector.", "model.multi_modal_projector.")


def rotary_table(cfg: Llama4VisionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) float32 [patches + 1, head_dim / 2] of each row's pairs, as
    `Llama4VisionRotaryEmbedding` computes its angles (the class token's last: 0)."""
    side = cfg.image_size // cfg.patch_size
    idx = torch.arange(side * side, dtype=torch.int32)
    x, y = idx % side, idx // side
    dim = cfg.hidden_size // cfg.num_heads // 2
    freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.cat([(x + 1)[:, None] * freq, (y + 1)[:, None] * freq], dim=-1).float()
    angles = torch.cat([angles, torch.zeros(1, angles.shape[1])])
    return torch.cos(angles), torch.sin(angles)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[N, T, H, D] turned pairwise (2i, 2i + 1) in float32 by (cos, sin) [T, D / 2]."""
    f = x.float().unflatten(-1, (-1, 2))
    a, b = f[..., 0], f[..., 1]
    c, s = cos[:, None], sin[:, None]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2).to(x.dtype)


class Llama4VisionTower:
    """`w`: the tensors under `vision_model.` by transformers' names, on the device in the
    model's dtype."""

    def __init__(self, w: Mapping[str, torch.Tensor], cfg: Llama4VisionConfig) -> None:
        self.cfg = cfg
        self.patch = w["patch_embedding.linear.weight"]  # [D, 3 p p]
        self.cls = w["class_embedding"]  # [D]
        self.positions = w["positional_embedding_vlm"]  # [patches + 1, D]
        if self.positions.shape[0] != cfg.num_patches + 1:
            raise ValueError(f"vision tower: {self.positions.shape[0]} positions for "
                             f"{cfg.num_patches} patches and the class token")  # fmt: skip
        self.pre = (w["layernorm_pre.weight"], w["layernorm_pre.bias"])
        self.post = (w["layernorm_post.weight"], w["layernorm_post.bias"])
        self.layers = [_layer(w, f"model.layers.{i}.") for i in range(cfg.num_layers)]
        self.fc1 = w["vision_adapter.mlp.fc1.weight"]
        self.fc2 = w["vision_adapter.mlp.fc2.weight"]
        cos, sin = rotary_table(cfg)
        self.cos, self.sin = cos.to(self.patch.device), sin.to(self.patch.device)

    def _norm(self, h: torch.Tensor, wb: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(h, (h.shape[-1],), *wb, self.cfg.norm_eps)

    def _attention(self, h: torch.Tensor, layer: dict[str, torch.Tensor]) -> torch.Tensor:
        n, t, d = h.shape
        heads = self.cfg.num_heads
        q, k, v = (
            F.linear(h, layer["qkv.weight"], layer["qkv.bias"]).view(n, t, 3, heads, -1).unbind(2)
        )
        q, k = _rotate(q, self.cos, self.sin), _rotate(k, self.cos, self.sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return F.linear(o.transpose(1, 2).reshape(n, t, d), layer["o.weight"], layer["o.bias"])

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] → the adapter's output [N, tokens_per_image, projector_output_dim]."""
        cfg = self.cfg
        x = F.unfold(pixel_values.to(self.patch.dtype), cfg.patch_size, stride=cfg.patch_size)
        h = F.linear(x.transpose(1, 2), self.patch)
        h = torch.cat([h, self.cls.expand(h.shape[0], 1, -1)], dim=1) + self.positions
        h = self._norm(h, self.pre)
        for layer in self.layers:
            h = h + self._attention(self._norm(h, layer["ln1"]), layer)
            m = F.gelu(
                F.linear(self._norm(h, layer["ln2"]), layer["fc1.weight"], layer["fc1.bias"])
            )
            h = h + F.linear(m, layer["fc2.weight"], layer["fc2.bias"])
        h = self._norm(h, self.post)[:, :-1]
        h = pixel_shuffle(h, cfg.shuffle)
        return F.gelu(F.linear(F.gelu(F.linear(h, self.fc1)), self.fc2))


def _layer(w: Mapping[str, torch.Tensor], p: str) -> dict:
    a = p + "self_attn."
    return {
        "ln1": (w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"]),
        "ln2": (w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"]),
        "qkv.weight": torch.cat([w[f"{a}{x}_proj.weight"] for x in "qkv"]),
        "qkv.bias": torch.cat([w[f"{a}{x}_proj.bias"] for x in "qkv"]),
        "o.weight": w[a + "o_proj.weight"],
        "o.bias": w[a + "o_proj.bias"],
        **{f"fc{i}.{k}": w[f"{p}mlp.fc{i}.{k}"] for i in (1, 2) for k in ("weight", "bias")},
    }


class Llama4VisionModel(Llama4Model):
    """Llama 4's text model reading images: the tower and projector on rank 0 (the features
    broadcast to the other ranks, as every vision family's)."""

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        vision = self.config.vision
        want = (self.config.hidden_size, vision.vision_output_dim)
        self.tower, self.projection = tower_and_projection(
            self, w, (_TOWER, _PROJECTOR), lambda t: Llama4VisionTower(t, vision),
            ("linear_1.weight", "multi_modal_projector's linear_1.weight", want),
        )  # fmt: skip

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, S, S] preprocessed tiles → [N, tokens_per_image, hidden] features."""
        return F.linear(self.tower(pixel_values), self.projection)
