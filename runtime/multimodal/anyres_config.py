"""LLaVA-NeXT's and LLaVA-OneVision's image side ("anyres"), read once from config.json and
the processor beside the checkpoint (plain data: the API process reads it too, no torch).

`LlavaNextForConditionalGeneration` (a CLIP tower, its class token dropped) and
`LlavaOnevisionForConditionalGeneration` (a SigLIP tower, every patch kept): each image is
cut into crops of the tower's size over the best of `image_grid_pinpoints` for its size, plus
the whole image resized to one crop (`anyres_processing.py`); the tower reads every crop, and
the model joins the crops' features back into the grid, unpadded to the image's aspect
(OneVision's: downsampled past `anyres_max_N` crops' worth), with the learned
`image_newline` after each row (`model/llava_next.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import (
    _ACTS,
    CLIP_MEAN,
    CLIP_STD,
    ImageProcessing,
    VisionConfig,
    _triple,
    processor_json,
    tower_shape,
)

KINDS = ("llava_next", "llava_onevision")
# the tower each wrapper's vision_config may name, with the feature select strategy its rows
# need (a crop's rows form a square grid: CLIP's without its class token, SigLIP's all)
TOWERS = {"clip_vision_model": "default", "siglip_vision_model": "full"}
_PROCESSORS = {
    "llava_next": ("LlavaNextImageProcessor", "LlavaNextImageProcessorFast",
                   "LlavaNextImageProcessorPil"),
    "llava_onevision": ("LlavaOnevisionImageProcessor", "LlavaOnevisionImageProcessorFast",
                        "LlavaOnevisionImageProcessorPil"),
}  # fmt: skip
# the config classes' defaults where config.json names no pinpoints
NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))
ONEVISION_PINPOINTS = tuple((384 * a, 384 * b) for a in range(1, 7) for b in range(1, 7))
_ASPECT = re.compile(r"^anyres_max_(\d+)$")


@dataclass(frozen=True)
class AnyresVisionConfig:
    """The tower and projector (`tower`: LLaVA's `VisionConfig`), the resolutions an image's
    crops may cover (`pinpoints`, (height, width) each, multiples of the tower's size), the
    cap on a grid's features in crops' worth (`max_crops`: OneVision's `anyres_max_N`; 0: none)
    and the per-crop pixel steps (`processing`: resample, rescale, normalize)."""

    kind: str  # "llava_next" or "llava_onevision" (`inputs.FAMILIES`)
    tower: VisionConfig
    siglip: bool  # SigLIP's tower (no class token, no pre-norm), else CLIP's
    pinpoints: tuple[tuple[int, int], ...]
    max_crops: int = 0
    processing: ImageProcessing = ImageProcessing()  # noqa: RUF009 (frozen)
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split an image)

    def __post_init__(self) -> None:
        s = self.tower.image_size
        if not self.pinpoints or any(h % s or w % s or h <= 0 or w <= 0
                                     for h, w in self.pinpoints):  # fmt: skip
            raise ValueError(f"image_grid_pinpoints {[list(p) for p in self.pinpoints]} must be "
                             f"multiples of the tower's image_size {s}")  # fmt: skip
        want = "full" if self.siglip else "default"
        if self.tower.select_strategy != want:
            raise ValueError(f"{self.kind} with a {'SigLIP' if self.siglip else 'CLIP'} tower and "
                             f"vision_feature_select_strategy {self.tower.select_strategy!r} is "
                             f"not supported ({want!r}: a crop's rows are its patches)")  # fmt: skip

    @property
    def image_token_index(self) -> int:
        return self.tower.image_token_index

    @property
    def image_size(self) -> int:
        return self.tower.image_size

    @property
    def side(self) -> int:
        """A crop's patches per side (the rows of its feature grid)."""
        return self.tower.image_size // self.tower.patch_size

    def num_params(self, text_hidden: int) -> int:
        """The tower's parameters the engine holds (the layers run), the projector and the
        newline embedding."""
        t = self.tower
        if not self.siglip:
            return t.num_params(text_hidden) + text_hidden
        d, i = t.hidden_size, t.intermediate_size
        layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
        embeddings = d * 3 * t.patch_size**2 + d + t.num_patches * d
        bias = 2 * text_hidden if t.projector_bias else 0
        projector = d * text_hidden + text_hidden * text_hidden + bias
        return t.layers_run * layer + embeddings + projector + text_hidden


def read_anyres(kind: str, top: dict[str, Any], model_dir: Path | None) -> AnyresVisionConfig:
    """A LLaVA-NeXT / OneVision config.json's image side (with the processor beside it);
    ValueError, one line, for what is not their shape."""
    v = top.get("vision_config") or {}
    vtype = v.get("model_type", "clip_vision_model" if kind == "llava_next" else
                  "siglip_vision_model")  # fmt: skip
    if vtype not in TOWERS:
        raise ValueError(f"{kind} with a vision_config of model_type {vtype!r} is not supported "
                         f"({', '.join(TOWERS)})")  # fmt: skip
    siglip = vtype == "siglip_vision_model"
    layer = top.get("vision_feature_layer", -1 if kind == "llava_onevision" else -2)
    if not isinstance(layer, int):
        raise ValueError(f"vision_feature_layer {layer!r}: only one layer is supported")
    act = v.get("hidden_act", "gelu_pytorch_tanh" if siglip else "quick_gelu")
    pact = top.get("projector_hidden_act", "gelu")
    for name, a in (("vision_config.hidden_act", act), ("projector_hidden_act", pact)):
        if a not in _ACTS:
            raise ValueError(f"{name} {a!r} is not supported ({', '.join(_ACTS)})")
    size = int(v.get("image_size", 384 if siglip else 224))
    default = "full" if kind == "llava_onevision" else "default"
    tower = VisionConfig(
        **tower_shape(v),
        image_size=size,
        patch_size=int(v.get("patch_size", 16 if siglip else 32)),
        image_token_index=int(top.get("image_token_index", top.get("image_token_id", 32000))),
        kind=kind,
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-6 if siglip else 1e-5)),
        hidden_act=_ACTS[act],
        feature_layer=layer,
        select_strategy=top.get("vision_feature_select_strategy", default),
        projector_act=_ACTS[pact],
        projector_bias=bool(top.get("multimodal_projector_bias", True)),
        processing=ImageProcessing(shortest_edge=size, crop=(size, size)),
    )
    pins = top.get("image_grid_pinpoints")
    pinpoints = _pinpoints(pins) if pins is not None else (
        ONEVISION_PINPOINTS if kind == "llava_onevision" else NEXT_PINPOINTS)  # fmt: skip
    max_crops = 0
    if kind == "llava_onevision":
        aspect = top.get("vision_aspect_ratio", "anyres_max_9")
        m = _ASPECT.match(str(aspect))
        if m is None or int(m.group(1)) < 1:
            raise ValueError(f"vision_aspect_ratio {aspect!r} is not supported (anyres_max_N)")
        max_crops = int(m.group(1))
    cfg = processor_json(model_dir) if model_dir is not None else None
    if cfg is not None:
        processing = _processing(kind, cfg, size, pinpoints)
    else:  # the processor classes' defaults at the tower's size (OneVision's crops none)
        processing = ImageProcessing(
            shortest_edge=size, crop=(size, size), do_center_crop=kind == "llava_next"
        )
    return AnyresVisionConfig(kind, tower, siglip, pinpoints, max_crops, processing)


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(h), int(w)) for h, w in value)
    except (TypeError, ValueError):
        raise ValueError(f"image_grid_pinpoints {value!r} must be [[height, width], ...]") from None


def _processing(kind: str, cfg: dict[str, Any], size: int,
                pinpoints: tuple[tuple[int, int], ...]) -> ImageProcessing:  # fmt: skip
    """The image processor's per-crop steps; ValueError, one line, for another processor, a
    crop that is not the tower's size or pinpoints other than the model's."""
    name = cfg.get("image_processor_type", _PROCESSORS[kind][0])
    if name not in _PROCESSORS[kind]:
        raise ValueError(f"preprocessor_config.json: image_processor_type {name!r} is not "
                         f"supported for {kind} ({', '.join(_PROCESSORS[kind])})")  # fmt: skip
    s = cfg.get("size", {"shortest_edge": size})
    s = {"shortest_edge": s} if isinstance(s, int) else s
    crop = cfg.get("crop_size") or {"height": size, "width": size}
    crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
    sides = {s.get("shortest_edge"), s.get("height"), s.get("width")} - {None}
    if sides != {size} or (crop.get("height"), crop.get("width")) != (size, size):
        raise ValueError(f"preprocessor_config.json: size {s} / crop_size {crop} are not the "
                         f"tower's {size}x{size} crops")  # fmt: skip
    pins = cfg.get("image_grid_pinpoints")
    if pins is not None and _pinpoints(pins) != pinpoints:
        raise ValueError("preprocessor_config.json's image_grid_pinpoints are not config.json's")
    if cfg.get("do_pad") is False:
        raise ValueError("preprocessor_config.json: do_pad false is not supported (anyres pads)")
    center = kind == "llava_next"  # (OneVision's processor crops none by default)
    return ImageProcessing(
        shortest_edge=size,
        crop=(size, size),
        resample=int(cfg.get("resample", 3)),
        rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
        mean=_triple(cfg.get("image_mean", CLIP_MEAN), "image_mean"),
        std=_triple(cfg.get("image_std", CLIP_STD), "image_std"),
        do_center_crop=bool(cfg.get("do_center_crop", center)),
        **{k: bool(cfg.get(k, True)) for k in ("do_resize", "do_rescale", "do_normalize",
                                               "do_convert_rgb")},
    )  # fmt: skip
