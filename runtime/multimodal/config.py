"""A vision-language checkpoint's image side, read once from its files: the vision tower's
shape (config.json's `vision_config`), how its features reach the text model (LLaVA's
`vision_feature_layer`, `vision_feature_select_strategy`, projector), its image token, and the
image processor (`preprocessor_config.json`, CLIPImageProcessor's fields). Frozen and plain
data: the API process reads it too (preprocessing there), so nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# vLLM's default cap on images per prompt (`--limit-mm-per-prompt '{"image": N}'`)
DEFAULT_IMAGE_LIMIT = 999
MODALITIES = ("image", "video")  # what --limit-mm-per-prompt caps (videos: Qwen2-VL's family)
# CLIPImageProcessor's defaults (OpenAI CLIP's mean and std, 224 px, bicubic)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh"}
_PROCESSORS = ("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPImageProcessorPil")
# Gemma 3's: a resize to exactly `size` ({"height", "width"}), no crop (`multimodal/gemma3.py`)
EXACT_PROCESSORS = ("Gemma3ImageProcessor", "Gemma3ImageProcessorFast", "Gemma3ImageProcessorPil")


@dataclass(frozen=True)
class PixelSteps:
    """What every image processor here shares after its resize: the resize filter
    (PIL's number), rescale, normalize, RGB (`image_processing.rescale_normalize`)."""

    resample: int = 3  # PIL.Image.BICUBIC
    rescale_factor: float = 1 / 255
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True


def processor_kind(
    cfg: dict[str, Any], supported: tuple[str, ...], default: str | None = None
) -> str:
    """preprocessor_config.json's `image_processor_type` (`default`, else `supported[0]`, where
    it names none); ValueError, one line, for one not in `supported`."""
    kind = cfg.get("image_processor_type", default or supported[0])
    if kind not in supported:
        raise ValueError(f"preprocessor_config.json: image_processor_type {kind!r} is not "
                         f"supported (supported: {', '.join(supported)})")  # fmt: skip
    return kind


def pixel_steps(cfg: dict[str, Any], resample: int = 3, mean: tuple = CLIP_MEAN,
                std: tuple = CLIP_STD) -> dict[str, Any]:  # fmt: skip
    """`PixelSteps`' fields from a preprocessor_config.json (the defaults given where left
    out)."""
    return dict(
        resample=int(cfg.get("resample", resample)),
        rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
        mean=_triple(cfg.get("image_mean", mean), "image_mean"),
        std=_triple(cfg.get("image_std", std), "image_std"),
        **{k: bool(cfg.get(k, True)) for k in ("do_resize", "do_rescale", "do_normalize",
                                               "do_convert_rgb")},
    )  # fmt: skip


@dataclass(frozen=True)
class ImageProcessing(PixelSteps):
    """CLIPImageProcessor's steps: convert to RGB (transparency over white), resize the shortest
    edge (`resample`: PIL's filter number), center-crop, rescale, normalize."""

    shortest_edge: int = 224
    crop: tuple[int, int] = (224, 224)  # (height, width)
    do_center_crop: bool = True
    exact_resize: bool = False  # resize to `crop` (height, width) itself (Gemma 3's), no crop

    @classmethod
    def from_json(cls, cfg: dict[str, Any]) -> ImageProcessing:
        kind = cfg.get("image_processor_type", "CLIPImageProcessor")
        if kind in EXACT_PROCESSORS:
            return cls.exact_from_json(cfg)
        processor_kind(cfg, _PROCESSORS)
        size = cfg.get("size", {"shortest_edge": 224})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        if set(size) != {"shortest_edge"}:
            raise ValueError(f"preprocessor_config.json: size {size} is not supported (a "
                             "CLIP processor's is {'shortest_edge': N})")  # fmt: skip
        crop = cfg.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        return cls(
            shortest_edge=int(size["shortest_edge"]),
            crop=(int(crop["height"]), int(crop["width"])),
            do_center_crop=bool(cfg.get("do_center_crop", True)),
            **pixel_steps(cfg),
        )

    @classmethod
    def exact_from_json(cls, cfg: dict[str, Any]) -> ImageProcessing:
        """Gemma3ImageProcessor's: resize to `size` (bilinear), rescale, normalize (0.5, 0.5);
        pan-and-scan is refused (one line)."""
        if cfg.get("do_pan_and_scan"):
            raise ValueError("preprocessor_config.json: do_pan_and_scan true is not supported "
                             "(Gemma 3's pan-and-scan crops): set it false")  # fmt: skip
        size = cfg.get("size", {"height": 896, "width": 896})
        if isinstance(size, int):
            size = {"height": size, "width": size}
        if set(size) != {"height", "width"}:
            raise ValueError(f"preprocessor_config.json: size {size} is not supported (a "
                             "Gemma 3 processor's is {'height': H, 'width': W})")  # fmt: skip
        half = (0.5, 0.5, 0.5)
        return cls(
            shortest_edge=int(size["height"]),
            crop=(int(size["height"]), int(size["width"])),
            do_center_crop=False,
            exact_resize=True,
            **pixel_steps(cfg, resample=2, mean=half, std=half),  # (PIL.Image.BILINEAR)
        )


def tokenizer_vocab(model_dir: Path | None) -> dict[str, int] | None:
    """tokenizer.json's vocabulary and added tokens beside the checkpoint (None: no file)."""
    path = None if model_dir is None else model_dir / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    tok = json.loads(path.read_text())
    vocab = tok.get("model", {}).get("vocab", {})
    if isinstance(vocab, list):  # (Unigram's [piece, score] rows)
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    return {**vocab, **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}


@dataclass(frozen=True)
class VisionConfig:
    """LLaVA 1.5's image side: a CLIP vision tower, the layer its features are taken from,
    whether the class token is dropped ("default") or kept ("full"), a 2-layer MLP projector."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    image_token_index: int
    kind: str = "llava"  # its family's image inputs (`inputs.FAMILIES`): llava, gemma3
    layer_norm_eps: float = 1e-5
    hidden_act: str = "quick_gelu"  # the tower's MLP
    feature_layer: int = -2  # `hidden_states[feature_layer]` (0: the embeddings)
    select_strategy: str = "default"  # "default": without the class token; "full": with it
    projector_act: str = "gelu"
    projector_bias: bool = True
    processing: ImageProcessing = ImageProcessing()
    # Gemma 3's (`multimodal/gemma3.py`): the tower's patch grid average-pooled to this many
    # rows (0: LLaVA's, every patch a row); the prompt's image marker (None: the image token
    # itself) replaced by `prefix`, the run of image tokens, `suffix`; `newlines`: the ids of
    # "\n" * k (k = 1, 2, ...), merged where the marker's text meets the prompt's newlines;
    # the image's tokens attend to each other both ways (`bidirectional`)
    pooled_tokens: int = 0
    marker: int | None = None
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    newlines: tuple[int, ...] = ()
    bidirectional: bool = False

    def __post_init__(self) -> None:
        if self.image_size < self.patch_size:  # (else the patch convolution floors: 384 / 14)
            raise ValueError(f"vision_config: image_size {self.image_size} is smaller than "
                             f"patch_size {self.patch_size}")  # fmt: skip
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {self.select_strategy!r} is not "
                             "supported (default, full)")  # fmt: skip
        if not -self.num_layers - 1 <= self.feature_layer <= self.num_layers:
            raise ValueError(f"vision_feature_layer {self.feature_layer} is outside the tower's "
                             f"{self.num_layers} layers")  # fmt: skip
        if self.processing.crop != (self.image_size, self.image_size):
            raise ValueError(f"preprocessor_config.json crops {self.processing.crop}, the vision "
                             f"tower reads {self.image_size}x{self.image_size} images")  # fmt: skip

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_image(self) -> int:
        """The placeholder tokens one image takes in the prompt (its features' rows)."""
        if self.pooled_tokens:
            return self.pooled_tokens
        return self.num_patches + (self.select_strategy == "full")

    def num_params(self, text_hidden: int) -> int:
        """The parameters the engine holds of the tower (the layers run, not its post-norm)
        and the projector into a text model `text_hidden` wide."""
        d, i = self.hidden_size, self.intermediate_size
        if self.pooled_tokens:  # SigLIP (every layer, its post-norm, no class token) + projector
            layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
            embeddings = d * 3 * self.patch_size**2 + d + self.num_patches * d + 2 * d
            return self.num_layers * layer + embeddings + d + d * text_hidden
        layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d  # attention, MLP, two LayerNorms
        embeddings = d * 3 * self.patch_size**2 + (self.num_patches + 1) * d + d + 2 * d
        bias = 2 * text_hidden if self.projector_bias else 0
        projector = d * text_hidden + text_hidden * text_hidden + bias
        return self.layers_run * layer + embeddings + projector

    @property
    def layers_run(self) -> int:
        """The tower layers whose output is read (`hidden_states[feature_layer]`)."""
        f = self.feature_layer
        return f if f >= 0 else self.num_layers + 1 + f


def parse_limits(value: Any) -> dict[str, int]:
    """vLLM's `--limit-mm-per-prompt` (a dict or its JSON text, e.g. {"image": 2, "video": 1})
    → the cap per modality (images, videos); None or an absent one: vLLM's default. ValueError,
    one line, for another modality or count."""
    if value is None:
        value = {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"limit_mm_per_prompt must be JSON such as '{{\"image\": 2}}', got "
                             f"{value!r}") from None  # fmt: skip
    if not isinstance(value, dict) or set(value) - set(MODALITIES):
        raise ValueError(f"limit_mm_per_prompt takes {{'image': N, 'video': N}} (images and "
                         f"videos are the modalities served), got {value!r}")  # fmt: skip
    out = {}
    for key in MODALITIES:
        n = value.get(key, DEFAULT_IMAGE_LIMIT)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"limit_mm_per_prompt's {key} count must be an integer >= 0, "
                             f"got {n!r}")  # fmt: skip
        out[key] = n
    return out


def tower_shape(v: dict[str, Any]) -> dict[str, int]:
    """A `vision_config`'s encoder shape (CLIP's and SigLIP's keys and defaults)."""
    return {
        "hidden_size": int(v.get("hidden_size", 768)),
        "intermediate_size": int(v.get("intermediate_size", 3072)),
        "num_layers": int(v.get("num_hidden_layers", 12)),
        "num_heads": int(v.get("num_attention_heads", 12)),
    }


def _triple(value: Any, name: str) -> tuple[float, float, float]:
    values = [value] * 3 if isinstance(value, (int, float)) else list(value)
    if len(values) != 3:
        raise ValueError(f"preprocessor_config.json: {name} must have 3 values, got {value}")
    return tuple(float(v) for v in values)  # type: ignore[return-value]


IMAGE_PROCESSOR_FILES = (
    ("preprocessor_config.json", None),
    ("processor_config.json", "image_processor"),
)


def processor_json(model_dir: Path, files=IMAGE_PROCESSOR_FILES) -> dict[str, Any] | None:
    """The image processor's fields saved beside the checkpoint: preprocessor_config.json
    (transformers 4's), else processor_config.json's `image_processor` (transformers 5's);
    `files`: another processor's ((file name, key in it or None), ...) in that order."""
    for name, key in files:
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            cfg = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{name} is not valid JSON ({e})") from None
        cfg = cfg.get(key) if key is not None and isinstance(cfg, dict) else cfg
        if isinstance(cfg, dict):
            return cfg
    return None


def read_processing(model_dir: Path, image_size: int,
                    default: ImageProcessing | None = None) -> ImageProcessing:  # fmt: skip
    """The image processor saved beside the checkpoint (`processor_json`), else `default`,
    else CLIP's defaults at the tower's size (what every LLaVA 1.5 checkpoint's processor
    says)."""
    cfg = processor_json(model_dir)
    if cfg is not None:
        return ImageProcessing.from_json(cfg)
    if default is not None:
        return default
    return ImageProcessing(shortest_edge=image_size, crop=(image_size, image_size))


def read_llava(top: dict[str, Any], model_dir: Path | None) -> VisionConfig:
    """A LlavaForConditionalGeneration config.json's image side (with the processor beside it);
    ValueError, one line, for what is not LLaVA 1.5's shape."""
    v = top.get("vision_config") or {}
    if v.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise ValueError(f"LlavaForConditionalGeneration with a vision_config of model_type "
                         f"{v.get('model_type')!r} is not supported (clip_vision_model)")  # fmt: skip
    kind = (top.get("text_config") or {}).get("model_type", "llama")
    if kind != "llama":  # (Mistral beside a pixtral tower: multimodal/pixtral_config.py)
        raise ValueError(f"LlavaForConditionalGeneration with a text_config of model_type "
                         f"{kind!r} is not supported beside a clip_vision_model (llama)")  # fmt: skip
    layer = top.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        raise ValueError(f"vision_feature_layer {layer!r}: only one layer is supported")
    act = v.get("hidden_act", "quick_gelu")
    pact = top.get("projector_hidden_act", "gelu")
    for name, a in (("vision_config.hidden_act", act), ("projector_hidden_act", pact)):
        if a not in _ACTS:
            raise ValueError(f"{name} {a!r} is not supported ({', '.join(_ACTS)})")
    size = int(v.get("image_size", 224))
    processing = ImageProcessing(shortest_edge=size, crop=(size, size))
    if model_dir is not None:
        processing = read_processing(model_dir, size)
    return VisionConfig(
        **tower_shape(v),
        image_size=size,
        patch_size=int(v.get("patch_size", 32)),
        image_token_index=int(top.get("image_token_index", top.get("image_token_id", 32000))),
        layer_norm_eps=float(v.get("layer_norm_eps", 1e-5)),
        hidden_act=_ACTS[act],
        feature_layer=layer,
        select_strategy=top.get("vision_feature_select_strategy", "default"),
        projector_act=_ACTS[pact],
        projector_bias=bool(top.get("multimodal_projector_bias", True)),
        processing=processing,
    )
