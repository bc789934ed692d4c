"""Pixtral's image side, read once from config.json, the processor and the tokenizer beside the
checkpoint (plain data: the API process reads it too, no torch): Mistral 3's
(`Mistral3ForConditionalGeneration`: Mistral-Small-3.1) and LLaVA's with a `pixtral`
vision_config (mistral-community/pixtral-12b).

The tower: a patch convolution without bias, an RMSNorm (`ln_pre`), pre-RMSNorm layers with 2-D
rotary attention over each image's patch grid and a gated MLP; `vision_feature_layer`'s hidden
state is read. Mistral 3's projector: an RMSNorm, a patch merger of `spatial_merge_size`^2
neighbours, linear-GELU-linear; LLaVA's: linear-act-linear. Each image of rows x columns merged
patches takes `[IMG]` x columns + `[IMG_BREAK]` per row, `[IMG_END]` last, in the prompt.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json, tokenizer_vocab
from pagoda.runtime.multimodal.pixtral_processing import PixtralImageProcessing

log = logging.getLogger(__name__)
ACTS = ("silu", "gelu")  # the tower's gated MLP and the projector's activation
MARKS = ("[IMG_BREAK]", "[IMG_END]")  # PixtralProcessor's default names


@dataclass(frozen=True)
class PixtralVisionConfig:
    width: int  # the tower's hidden size
    intermediate_size: int
    num_layers: int
    num_heads: int
    patch_size: int
    image_token_index: int  # [IMG]
    break_token: int  # [IMG_BREAK]
    end_token: int  # [IMG_END]
    kind: str = "pixtral"  # its family's image inputs (`inputs.FAMILIES`)
    projector: str = "mistral3"  # "mistral3" (norm, patch merger, MLP) or "llava" (MLP)
    merge_size: int = 1  # `spatial_merge_size` (Mistral 3's patch merger; LLaVA's: 1)
    rope_theta: float = 10000.0
    hidden_act: str = "silu"  # the tower's gated MLP
    feature_layer: int = -1  # `hidden_states[feature_layer]` (0: after ln_pre)
    projector_act: str = "gelu"
    projector_bias: bool = False
    processing: PixtralImageProcessing = PixtralImageProcessing()  # noqa: RUF009 (frozen)
    bidirectional: bool = False  # (causal image tokens: prefill chunks may split an image)

    def __post_init__(self) -> None:
        if self.width % self.num_heads or (self.width // self.num_heads) % 4:
            raise ValueError(f"vision_config: a head of {self.width}/{self.num_heads} is not a "
                             "multiple of 4 (its 2-D rotary)")  # fmt: skip
        if not -self.num_layers - 1 <= self.feature_layer <= self.num_layers:
            raise ValueError(f"vision_feature_layer {self.feature_layer} is outside the tower's "
                             f"{self.num_layers} layers")  # fmt: skip
        if self.processing.patch != self.patch_size * self.merge_size:
            raise ValueError(f"the processor's patch {self.processing.patch} is not the tower's "
                             f"{self.patch_size} x spatial_merge_size {self.merge_size}")  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def layers_run(self) -> int:
        """The tower layers whose output is read (`hidden_states[feature_layer]`)."""
        f = self.feature_layer
        return f if f >= 0 else self.num_layers + 1 + f

    def num_params(self, text_hidden: int) -> int:
        """The tower's parameters the engine holds (the layers run) and the projector's."""
        d, i = self.width, self.intermediate_size
        layer = 4 * d * d + 3 * d * i + 2 * d
        tower = 3 * self.patch_size**2 * d + d + self.layers_run * layer
        bias = 2 * text_hidden if self.projector_bias else 0
        projector = d * text_hidden + text_hidden * text_hidden + bias
        if self.projector == "mistral3":
            projector += d + d * self.merge_size**2 * d
        return tower + projector


def token_ids(model_dir: Path | None, names: tuple[str, ...]) -> tuple[int, ...] | None:
    """The ids of the tokens `names` in tokenizer.json beside the checkpoint; None where there
    is none, or it lacks one of them."""
    vocab = tokenizer_vocab(model_dir)
    if vocab is None or any(n not in vocab for n in names):
        return None
    return tuple(int(vocab[n]) for n in names)


def read_pixtral(top: dict[str, Any], model_dir: Path | None) -> PixtralVisionConfig | None:
    """The image side of a Mistral 3 or LLaVA config.json whose vision_config is `pixtral`;
    ValueError, one line, for what is not its shape; None for Mistral 3 (text only, logged)
    without the tokenizer.json that names `[IMG_BREAK]` and `[IMG_END]` (LLaVA's: refused)."""
    proc = {}
    if model_dir is not None and (model_dir / "processor_config.json").is_file():
        try:
            proc = json.loads((model_dir / "processor_config.json").read_text())
        except ValueError as e:
            raise ValueError(f"processor_config.json is not valid JSON ({e})") from None
    names = tuple(proc.get(k, d) for k, d in zip(("image_break_token", "image_end_token"), MARKS))
    marks = token_ids(model_dir, names)
    mistral3 = top.get("architectures", [None])[0] == "Mistral3ForConditionalGeneration"
    if marks is None and not mistral3:  # (LLaVA's text model is not served without its images)
        raise ValueError(f"LLaVA with a pixtral vision_config needs the tokenizer.json naming "
                         f"{' and '.join(names)} beside the checkpoint")  # fmt: skip
    if marks is None:
        log.warning("no tokenizer.json naming %s beside the checkpoint: it is read text-only "
                    "(images refused)", " and ".join(names))  # fmt: skip
        return None
    v = top.get("vision_config") or {}
    text = top.get("text_config") or {}
    layer = top.get("vision_feature_layer", -1 if mistral3 else -2)  # (their configs' defaults)
    if not isinstance(layer, int):
        raise ValueError(f"vision_feature_layer {layer!r}: only one layer is supported")
    if not mistral3 and top.get("vision_feature_select_strategy", "default") != "full":
        raise ValueError("LLaVA with a pixtral vision_config: vision_feature_select_strategy "
                         f"{top.get('vision_feature_select_strategy')!r} is not supported (full)")  # fmt: skip
    if not mistral3 and text.get("sliding_window") is not None:
        raise ValueError("LLaVA with a pixtral vision_config: text_config.sliding_window "
                         f"{text['sliding_window']} is not supported (null)")  # fmt: skip
    act, pact = v.get("hidden_act", "gelu"), top.get("projector_hidden_act", "gelu")
    for name, a in (("vision_config.hidden_act", act), ("projector_hidden_act", pact)):
        if a not in ACTS:
            raise ValueError(f"{name} {a!r} is not supported ({', '.join(ACTS)})")
    patch = int(v.get("patch_size", 16))
    merge = int(top.get("spatial_merge_size", 2)) if mistral3 else 1
    cfg = None if model_dir is None else processor_json(model_dir)
    processing = PixtralImageProcessing(patch=patch * merge)
    if cfg is not None:
        processing = PixtralImageProcessing.from_json(cfg, patch * merge)
    rope = v.get("rope_parameters") or {}
    token = 10 if mistral3 else 32000  # (Mistral3Config's and LlavaConfig's defaults)
    return PixtralVisionConfig(
        width=int(v.get("hidden_size", 1024)),
        intermediate_size=int(v.get("intermediate_size", 4096)),
        num_layers=int(v.get("num_hidden_layers", 24)),
        num_heads=int(v.get("num_attention_heads", 16)),
        patch_size=patch,
        image_token_index=int(top.get("image_token_index", top.get("image_token_id", token))),
        break_token=marks[0],
        end_token=marks[1],
        projector="mistral3" if mistral3 else "llava",
        merge_size=merge,
        rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 10000.0))),
        hidden_act=act,
        feature_layer=layer,
        projector_act=pact,
        projector_bias=bool(top.get("multimodal_projector_bias", not mistral3)),
        processing=processing,
    )
