"""InternVL's image side (`InternVLForConditionalGeneration`: InternVL3, InternVL3.5 in
transformers' format), read once from config.json, the image processor and the tokenizer
beside the checkpoint (plain data, torch-free: the API process reads it too).

The tower is InternViT (`vision_config`: a class token and learned positions, layers with a
layer scale on each branch, LayerNorm or RMSNorm, q/k RMSNorms in the larger towers) over
square tiles of `image_size` pixels; its patch rows, the class token dropped, are pixel-shuffled
(`downsample_ratio` 0.5: each 2 x 2 block one row) and projected (LayerNorm, linear, GELU,
linear) to the text model's width: a tile is (image_size / patch_size)² / 4 rows. The processor
(`GotOcr2ImageProcessor`: `internvl_processing.py`) cuts an image into tiles and a thumbnail;
the prompt holds `<img>`, `<IMG_CONTEXT>` per row of every tile, `</img>` (ids read from
tokenizer.json, names from tokenizer_config.json).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json
from pagoda.runtime.multimodal.internvl_processing import TileProcessing

log = logging.getLogger(__name__)
# tokenizer_config.json's names of the image tokens, and InternVL's own
TOKEN_NAMES = {"start_image_token": "<img>", "end_image_token": "</img>",
               "context_image_token": "<IMG_CONTEXT>"}  # fmt: skip


@dataclass(frozen=True)
class InternVLVisionConfig:
    """The tower's shape and options, the projector's, the processor, and the image tokens."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # a tile's side
    patch_size: int
    image_token_index: int  # <IMG_CONTEXT>
    start_token: int  # <img>
    end_token: int  # </img>
    processing: TileProcessing
    rms_norm: bool = False  # norm_type "rms_norm" (else LayerNorm)
    qk_norm: bool = False  # use_qk_norm: RMSNorms over q and k (all heads at once)
    attention_bias: bool = False
    final_norm: bool = False  # use_mean_pooling false: a LayerNorm after the last layer
    layer_norm_eps: float = 1e-6
    kind: str = "internvl"  # its image inputs (`inputs.FAMILIES`)
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split a tile)

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size or (self.image_size // self.patch_size) % 2:
            raise ValueError(f"vision_config: a {self.image_size} px tile of {self.patch_size} "
                             "px patches is not an even grid (pixel shuffle by 0.5)")  # fmt: skip
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision_config: hidden_size {self.hidden_size} is not a multiple "
                             f"of num_attention_heads {self.num_heads}")  # fmt: skip
        if self.processing.tile != self.image_size:
            raise ValueError(f"the image processor's tile {self.processing.tile} is not the "
                             f"tower's image_size {self.image_size}")  # fmt: skip

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        """The placeholder tokens of one tile (its features' rows)."""
        return self.num_patches // 4

    def num_params(self, text_hidden: int) -> int:
        """The tower's parameters (every layer, its final norm) and the projector's."""
        d, i = self.hidden_size, self.intermediate_size
        norm = d if self.rms_norm else 2 * d
        attention = 4 * d * d + (3 * d if self.attention_bias else 0) + d + 2 * d * self.qk_norm
        layer = attention + 2 * d * i + i + d + 2 * norm + 2 * d  # (+ the two layer scales)
        embeddings = d * 3 * self.patch_size**2 + d + d + (self.num_patches + 1) * d
        shuffled = 4 * d
        projector = 2 * shuffled + shuffled * text_hidden + text_hidden * (text_hidden + 2)
        final = 2 * d if self.final_norm else 0
        return self.num_layers * layer + embeddings + final + projector


def _side(value: Any, name: str) -> int:
    """A square size (an int or [h, w] with h == w); ValueError otherwise."""
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(sides) != 2 or sides[0] != sides[1]:
        raise ValueError(f"vision_config.{name} {value} is not square (supported: one size)")
    return int(sides[0])


def _check_top(top: dict[str, Any], v: dict[str, Any]) -> None:
    """ValueError, one line, for a config.json of options this runtime does not run."""
    want = {"downsample_ratio": 0.5, "projector_hidden_act": "gelu", "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default"}  # fmt: skip
    for key, value in want.items():
        if top.get(key, value) != value:
            raise ValueError(f"an InternVL config.json with {key} {top[key]!r} is not "
                             f"supported ({value!r})")  # fmt: skip
    vwant = {"hidden_act": "gelu", "use_absolute_position_embeddings": True, "num_channels": 3,
             "use_mask_token": False}  # fmt: skip
    for key, value in vwant.items():
        if v.get(key, value) != value:
            raise ValueError(f"vision_config.{key} {v[key]!r} is not supported ({value!r})")
    if v.get("norm_type", "layer_norm") not in ("layer_norm", "rms_norm"):
        raise ValueError(f"vision_config.norm_type {v['norm_type']!r} is not supported "
                         "(layer_norm, rms_norm)")  # fmt: skip


def _token_ids(model_dir: Path) -> dict[str, int] | None:
    """The ids of `<img>`, `</img>` and `<IMG_CONTEXT>` in tokenizer.json (their names as
    tokenizer_config.json gives them); None where it lacks one (images refused)."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    names = dict(TOKEN_NAMES)
    side = model_dir / "tokenizer_config.json"
    if side.is_file():
        try:
            cfg = json.loads(side.read_text())
        except ValueError as e:
            raise ValueError(f"tokenizer_config.json is not valid JSON ({e})") from None
        names.update({k: cfg[k] for k in TOKEN_NAMES if isinstance(cfg.get(k), str)})
    tok = Tokenizer.from_file(str(path))
    ids = {k: tok.token_to_id(name) for k, name in names.items()}
    return None if None in ids.values() else ids  # type: ignore[return-value]


def read_internvl(top: dict[str, Any], model_dir: Path | None) -> InternVLVisionConfig | None:
    """An InternVL config.json's image side; ValueError, one line, for what is not its shape;
    None (text only, logged) without a tokenizer.json holding the image tokens."""
    v = top.get("vision_config") or {}
    if v.get("model_type", "internvl_vision") != "internvl_vision":
        raise ValueError(f"a vision_config of model_type {v.get('model_type')!r} is not "
                         "supported (internvl_vision)")  # fmt: skip
    _check_top(top, v)
    size, patch = (
        _side(v.get("image_size", 448), "image_size"),
        _side(v.get("patch_size", 14), "patch_size"),
    )
    cfg = (processor_json(model_dir) if model_dir is not None else None) or {}
    processing = TileProcessing.from_json(cfg, size)
    ids = None if model_dir is None else _token_ids(model_dir)
    if ids is None:
        log.warning("no tokenizer.json with <img>, </img> and <IMG_CONTEXT> beside the "
                    "checkpoint: it is read text-only (images refused)")  # fmt: skip
        return None
    context = int(top.get("image_token_id", 151_667))
    if context != ids["context_image_token"]:
        raise ValueError(f"config.json's image_token_id {context} is not the tokenizer's "
                         f"context image token ({ids['context_image_token']})")  # fmt: skip
    vision = InternVLVisionConfig(
        hidden_size=int(v.get("hidden_size", 1024)),  # (InternVLVisionConfig's defaults)
        intermediate_size=int(v.get("intermediate_size", 4096)),
        num_layers=int(v.get("num_hidden_layers", 24)),
        num_heads=int(v.get("num_attention_heads", 16)),
        image_size=size,
        patch_size=patch,
        image_token_index=context,
        start_token=ids["start_image_token"],
        end_token=ids["end_image_token"],
        processing=processing,
        rms_norm=v.get("norm_type", "layer_norm") == "rms_norm",
        qk_norm=bool(v.get("use_qk_norm", False)),
        attention_bias=bool(v.get("attention_bias", False)),
        final_norm=not v.get("use_mean_pooling", True),
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-6)),
    )
    seq = int(top.get("image_seq_length", vision.tokens_per_image))
    if seq != vision.tokens_per_image:
        raise ValueError(f"config.json's image_seq_length {seq} is not the {vision.tokens_per_image} "
                         "rows a tile gives ((image_size / patch_size)² / 4)")  # fmt: skip
    return vision
