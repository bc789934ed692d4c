"""Llama 4's image side (`Llama4ForConditionalGeneration`: Scout, Maverick), read once from
config.json's `vision_config`, the processor and the tokenizer beside the checkpoint (plain
data, torch-free: the API process reads it too).

The tower (`model/llama4_vision.py`) embeds each square tile of `image_size` pixels as
patches of `patch_size` (an unfold and a matrix) plus a class token, runs its layers (2D
rotary attention), drops the class token and shuffles each 2 x 2 block of patches into one row
(`pixel_shuffle_ratio` 0.5) before its adapter MLP and the projector into the text model's
width: a tile is (image_size / patch_size)² x ratio² rows. The processor
(`Llama4ImageProcessor`: `llama4_processing.py`) cuts an image into tiles and, with more than
one, a global tile; the prompt holds the tokens `Llama4Processor` writes around them
(`<|image_start|>`, `<|patch|>` runs, `<|tile_x_separator|>`, `<|tile_y_separator|>`,
`<|image|>`, `<|image_end|>`), read from tokenizer.json.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json
from pagoda.runtime.multimodal.llama4_processing import Llama4Processing

log = logging.getLogger(__name__)
TOKENS = {"image_token": "<|image|>", "patch": "<|patch|>", "start": "<|image_start|>",
          "end": "<|image_end|>", "tile_x": "<|tile_x_separator|>",
          "tile_y": "<|tile_y_separator|>"}  # fmt: skip


@dataclass(frozen=True)
class Llama4VisionConfig:
    """The tower's and adapter's shape, the projector's input, the processor, and the ids of
    the prompt's image text (`image_token_index`: `<|patch|>`, the rows the features fill;
    `image_token`: `<|image|>`, where a prompt puts each image)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # a tile's side
    patch_size: int
    shuffle: int  # 1 / pixel_shuffle_ratio: each shuffle x shuffle block of patches a row
    projector_input_dim: int
    projector_output_dim: int
    vision_output_dim: int
    rope_theta: float
    image_token_index: int  # <|patch|>
    image_token: int  # <|image|>
    start: int  # <|image_start|>
    end: int  # <|image_end|>
    tile_x: int  # <|tile_x_separator|>
    tile_y: int  # <|tile_y_separator|>
    processing: Llama4Processing
    kind: str = "llama4"  # its image inputs (`inputs.FAMILIES`)
    norm_eps: float = 1e-5  # (transformers' LayerNorms keep torch's default: not norm_eps)
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split a tile)

    def __post_init__(self) -> None:
        side = self.image_size // self.patch_size
        if self.image_size % self.patch_size or side % self.shuffle:
            raise ValueError(f"vision_config: a {self.image_size} px tile of {self.patch_size} "
                             f"px patches is not a grid 1 / pixel_shuffle_ratio divides")  # fmt: skip
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(f"vision_config: hidden_size {self.hidden_size} over "
                             f"{self.num_heads} heads is not a head of a multiple of 4 (2D "
                             "rotary pairs)")  # fmt: skip
        if self.intermediate_size != self.hidden_size * self.shuffle**2:
            raise ValueError(f"vision_config: intermediate_size {self.intermediate_size} is "
                             f"not the shuffled patch's width hidden_size x {self.shuffle**2} "
                             "(the adapter's fc1 reads it)")  # fmt: skip
        if self.projector_input_dim != self.projector_output_dim:
            raise ValueError("vision_config: projector_input_dim and projector_output_dim "
                             "differ (the adapter's fc2 is square)")  # fmt: skip
        if self.processing.tile != self.image_size:
            raise ValueError(f"the image processor's size {self.processing.tile} is not the "
                             f"tower's image_size {self.image_size}")  # fmt: skip

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        """The placeholder tokens of one tile (its features' rows)."""
        return self.num_patches // self.shuffle**2

    def num_params(self, text_hidden: int) -> int:
        """The tower's, its adapter's and the projector's parameters."""
        d, i = self.hidden_size, self.intermediate_size
        layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
        embed = 3 * self.patch_size**2 * d + d + (self.num_patches + 1) * d + 4 * d
        adapter = i * self.projector_input_dim + self.projector_output_dim**2
        return self.num_layers * layer + embed + adapter + self.vision_output_dim * text_hidden


def _token_ids(model_dir: Path | None) -> dict[str, int] | None:
    """The ids of the prompt's image text in tokenizer.json (None where it lacks one)."""
    from tokenizers import Tokenizer

    path = None if model_dir is None else model_dir / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    ids = {k: tok.token_to_id(v) for k, v in TOKENS.items()}
    return None if None in ids.values() else ids


def _processor_fields(model_dir: Path | None) -> dict[str, Any]:
    """processor_config.json's own fields (`patch_size`, `pixel_shuffle_ratio`; {} without)."""
    path = None if model_dir is None else model_dir / "processor_config.json"
    if path is None or not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"processor_config.json is not valid JSON ({e})") from None
    return cfg if isinstance(cfg, dict) else {}


def _shuffle(ratio: float, name: str) -> int:
    shuffle = round(1 / ratio) if ratio > 0 else 0
    if shuffle < 1 or abs(1 / shuffle - ratio) > 1e-9:
        raise ValueError(f"{name} {ratio} is not 1 / an integer")
    return shuffle


def _checked_processor(model_dir: Path | None, tokens: int, size: int) -> None:
    """ValueError where the processor's tokens per tile (its patch_size and
    pixel_shuffle_ratio) are not the tower's."""
    p = _processor_fields(model_dir)
    patch = int(p.get("patch_size", 14))
    shuffle = _shuffle(float(p.get("pixel_shuffle_ratio", 0.5)), "processor pixel_shuffle_ratio")
    want = (size // patch) ** 2 // shuffle**2
    if want != tokens:
        raise ValueError(f"the processor writes {want} <|patch|> tokens a tile (patch_size "
                         f"{patch}), the tower gives {tokens} rows")  # fmt: skip


def read_llama4_vision(top: dict[str, Any], model_dir: Path | None) -> Llama4VisionConfig | None:
    """A Llama4ForConditionalGeneration config.json's image side; ValueError, one line, for
    what is not its shape; None (text only, logged) without a vision_config or a tokenizer.json
    holding the image tokens, or for an FP8 checkpoint."""
    v = top.get("vision_config")
    if not isinstance(v, dict):
        return None
    if top.get("quantization_config"):  # (Maverick's FP8 release)
        log.warning("an FP8 Llama 4 checkpoint is read text-only (its vision tower is not read "
                    "in FP8): images are refused")  # fmt: skip
        return None
    ids = _token_ids(model_dir)
    if ids is None:
        log.warning("no tokenizer.json with Llama 4's image tokens (<|image|>, <|patch|>, ...) "
                    "beside the checkpoint: it is read text-only (images refused)")  # fmt: skip
        return None
    if v.get("model_type", "llama4_vision_model") != "llama4_vision_model":
        raise ValueError(f"a vision_config of model_type {v.get('model_type')!r} is not "
                         "supported (llama4_vision_model)")  # fmt: skip
    act = v.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"vision_config.hidden_act {act!r} is not supported (gelu)")
    patch = top.get("image_token_index", top.get("image_token_id", 200_092))
    if int(patch) != ids["patch"]:
        raise ValueError(f"image_token_index {patch} is not the tokenizer's <|patch|> "
                         f"({ids['patch']})")  # fmt: skip
    size, patch_size = int(v.get("image_size", 448)), int(v.get("patch_size", 14))
    rope = v.get("rope_parameters") or {}
    cfg = (processor_json(model_dir) if model_dir is not None else None) or {}
    config = Llama4VisionConfig(
        hidden_size=int(v.get("hidden_size", 768)),  # (Llama4VisionConfig's defaults)
        intermediate_size=int(v.get("intermediate_size", 5632)),
        num_layers=int(v.get("num_hidden_layers", 34)),
        num_heads=int(v.get("num_attention_heads", 16)),
        image_size=size,
        patch_size=patch_size,
        shuffle=_shuffle(float(v.get("pixel_shuffle_ratio", 0.5)), "pixel_shuffle_ratio"),
        projector_input_dim=int(v.get("projector_input_dim", 4096)),
        projector_output_dim=int(v.get("projector_output_dim", 4096)),
        vision_output_dim=int(v.get("vision_output_dim", 7680)),
        rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 10_000.0))),
        image_token_index=ids["patch"],
        image_token=ids["image_token"],
        start=ids["start"],
        end=ids["end"],
        tile_x=ids["tile_x"],
        tile_y=ids["tile_y"],
        processing=Llama4Processing.from_json(cfg, size),
    )
    if config.projector_output_dim != config.vision_output_dim:
        raise ValueError(f"vision_config: projector_output_dim {config.projector_output_dim} "
                         f"is not vision_output_dim {config.vision_output_dim} (the projector "
                         "reads the adapter's output)")  # fmt: skip
    _checked_processor(model_dir, config.tokens_per_image, size)
    return config
