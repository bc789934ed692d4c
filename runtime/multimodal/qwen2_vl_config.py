"""Qwen2-VL's and Qwen2.5-VL's image side, read once from config.json's `vision_config` and
the processor beside the checkpoint (plain data: the API process reads it too, no torch).

Qwen2-VL's tower: LayerNorm blocks with a QuickGELU MLP (`embed_dim` wide, `mlp_ratio`), full
attention, a LayerNorm patch merger into the text model's width (`hidden_size`). Qwen2.5-VL's:
RMSNorm blocks with a SwiGLU MLP (`hidden_size` wide, `intermediate_size`), window attention
(`window_size` pixels) except in `fullatt_block_indexes`, an RMSNorm merger into
`out_hidden_size`. Both: Conv3d patches of `temporal_patch_size` x `patch_size`^2, 2-D rotary
on the heads, `spatial_merge_size`^2 patches merged into one text token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing

KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # (Qwen3-VL's: `qwen3_vl_config.py`)


@dataclass(frozen=True)
class QwenVisionConfig:
    kind: str  # "qwen2_vl", "qwen2_5_vl" or "qwen3_vl"
    width: int  # the tower's hidden size
    intermediate_size: int
    depth: int
    num_heads: int
    out_size: int  # the merger's output: the text model's hidden size
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_token_index: int  # <|image_pad|>
    rope_theta: float = 10000.0
    hidden_act: str = "quick_gelu"
    window_size: int = 0  # Qwen2.5-VL's window attention (pixels); 0: full everywhere
    fullatt_blocks: tuple[int, ...] = ()
    mrope_section: tuple[int, ...] = (16, 24, 24)  # the text rotary's (t, h, w) frequencies
    processing: QwenImageProcessing = QwenImageProcessing()  # noqa: RUF009 (frozen)
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split an image)
    # Qwen3-VL's: its learned position table's rows (a square grid, resampled to each image's),
    # the blocks whose features DeepStack adds to the first text layers' image rows, and its
    # text rotary's sections interleaved (t, h, w, t, h, w, ...) rather than in three runs
    pos_embeddings: int = 0
    deepstack: tuple[int, ...] = ()
    mrope_interleaved: bool = False
    # video: `<|video_pad|>`, the video processor's fields (`video_processor_json`; the image
    # processor's where the checkpoint saves none, as transformers falls back) and Qwen2.5-VL's
    # temporal positions per second of video (0: a video's temporal patches 1 apart)
    video_token_index: int = 151656
    video_processing: QwenImageProcessing | None = None
    tokens_per_second: float = 0.0

    def __post_init__(self) -> None:
        if self.width % self.num_heads or (self.width // self.num_heads) % 4:
            raise ValueError(f"vision_config: a head of {self.width}/{self.num_heads} is not a "
                             "multiple of 4 (its 2-D rotary)")  # fmt: skip
        for what, p in (("image", self.processing), ("video", self.video)):
            if (p.patch_size, p.temporal_patch_size, p.merge_size) != (
                self.patch_size, self.temporal_patch_size, self.merge_size):  # fmt: skip
                raise ValueError(f"the {what} processor's patches ({p.patch_size}, "
                                 f"{p.temporal_patch_size}, merge {p.merge_size}) are not the "
                                 f"tower's ({self.patch_size}, {self.temporal_patch_size}, merge "
                                 f"{self.merge_size})")  # fmt: skip
        side = math.isqrt(self.pos_embeddings)
        if self.kind == "qwen3_vl" and (side < 2 or side * side != self.pos_embeddings):
            raise ValueError(f"vision_config: num_position_embeddings {self.pos_embeddings} is "
                             "not the square of a side of 2 or more")  # fmt: skip
        if any(not 0 <= i < self.depth for i in self.deepstack):
            raise ValueError(f"vision_config: deepstack_visual_indexes {list(self.deepstack)} "
                             f"are not blocks of a {self.depth}-block tower")  # fmt: skip
        if self.kind == "qwen2_5_vl" and self.window_size % (self.patch_size * self.merge_size):
            raise ValueError(f"vision_config: window_size {self.window_size} is not a multiple "
                             f"of patch_size x spatial_merge_size")  # fmt: skip

    @property
    def video(self) -> QwenImageProcessing:
        """The video processor's fields."""
        return self.video_processing or self.processing

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size**2

    def num_params(self, text_hidden: int) -> int:
        d, i, m = self.width, self.intermediate_size, self.width * self.merge_size**2
        mlp = 3 * d * i + 2 * i + d if self.kind == "qwen2_5_vl" else 2 * d * i + i + d
        block = 4 * d * d + 4 * d + mlp + 4 * d
        merger = m * m + m + m * self.out_size + self.out_size
        if self.kind == "qwen3_vl":  # patch bias, position table, DeepStack's mergers (m norms)
            extra = d + self.pos_embeddings * d + len(self.deepstack) * (merger + 2 * m)
            return self.depth * block + self.patch_dim * d + 2 * d + merger + extra
        return self.depth * block + self.patch_dim * d + 2 * d + merger


def read_processing(model_dir: Path | None) -> QwenImageProcessing:
    """The processor saved beside the checkpoint (`config.processor_json`);
    Qwen2VLImageProcessor's defaults where none is saved."""
    cfg = None if model_dir is None else processor_json(model_dir)
    return QwenImageProcessing() if cfg is None else QwenImageProcessing.from_json(cfg)


# the video processor's fields: transformers 4's file, else transformers 5's processor file's
VIDEO_PROCESSOR_FILES = (("video_preprocessor_config.json", None),
                         ("processor_config.json", "video_processor"))  # fmt: skip


def read_video_processing(model_dir: Path | None) -> QwenImageProcessing | None:
    """The video processor saved beside the checkpoint (`VIDEO_PROCESSOR_FILES`); None where
    there is none (the image processor's fields are used)."""
    cfg = None if model_dir is None else processor_json(model_dir, VIDEO_PROCESSOR_FILES)
    return None if cfg is None else QwenImageProcessing.from_json(cfg)


def read_qwen2_vl(arch: str, top: dict[str, Any], model_dir: Path | None) -> QwenVisionConfig:
    """A Qwen2-VL / Qwen2.5-VL (`arch`: qwen2_vl, qwen2_5_vl) config.json's image side;
    ValueError, one line, on a bad one."""
    kind = arch
    v = top.get("vision_config") or {}
    token = top.get("image_token_id", top.get("image_token_index", 151655))
    common = dict(
        kind=kind,
        depth=int(v.get("depth", 32)),
        num_heads=int(v.get("num_heads", 16)),
        patch_size=int(v.get("patch_size", 14)),
        temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        merge_size=int(v.get("spatial_merge_size", 2)),
        image_token_index=int(token),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        processing=read_processing(model_dir),
        mrope_section=mrope_section(top),
        video_token_index=int(top.get("video_token_id", 151656)),
        video_processing=read_video_processing(model_dir),
    )
    act = v.get("hidden_act", "quick_gelu" if kind == "qwen2_vl" else "silu")
    if act not in ("quick_gelu", "silu", "gelu"):
        raise ValueError(f"vision_config.hidden_act {act!r} is not supported")
    if kind == "qwen2_vl":
        width = int(v.get("embed_dim", 1280))
        return QwenVisionConfig(width=width, intermediate_size=width * int(v.get("mlp_ratio", 4)),
                                out_size=int(v.get("hidden_size", 3584)), hidden_act=act,
                                **common)  # fmt: skip
    return QwenVisionConfig(
        width=int(v.get("hidden_size", 1280)),
        intermediate_size=int(v.get("intermediate_size", 3420)),
        out_size=int(v.get("out_hidden_size", 3584)),
        hidden_act=act,
        window_size=int(v.get("window_size", 112)),
        tokens_per_second=float(v.get("tokens_per_second", 4)),
        fullatt_blocks=tuple(int(i) for i in v.get("fullatt_block_indexes", (7, 15, 23, 31))),
        **common,
    )


def mrope_section(top: dict[str, Any], default: tuple[int, ...] = (16, 24, 24)) -> tuple[int, ...]:
    """The text rotary's (t, h, w) frequencies (`default`: the family's where none is set)."""
    text = top.get("text_config") or top
    for key in ("rope_parameters", "rope_scaling"):
        rope = text.get(key) or top.get(key) or {}
        if isinstance(rope, dict) and "mrope_section" in rope:
            section = tuple(int(s) for s in rope["mrope_section"])
            if len(section) != 3:
                raise ValueError(f"{key}.mrope_section must have 3 values, got {section}")
            return section
    return default
