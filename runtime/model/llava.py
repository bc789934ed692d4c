"""LLaVA 1.5 (`LlavaForConditionalGeneration`): a CLIP vision tower (`clip_vision.py`), a
2-layer MLP projector, and a Llama text model (this family's `LlamaModel` as it stands).

`encode_images` turns preprocessed pixels into the rows that replace the prompt's image
placeholder tokens: the tower's `hidden_states[vision_feature_layer]`, without the class token
("default") or with it ("full"), projected to the text model's width. The runner runs it once
per image and scatters the rows into the step's input embeddings (`worker/mm_encoder.py`,
`llama.IMAGE_EMBEDS`); the text model never sees pixels.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from pagoda.runtime.model.clip_vision import ClipVisionTower, activation
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.multimodal.config import VisionConfig

# stored prefix -> this module's (transformers 4's and 5's names, with or without `model.`)
_TOWER = ("model.vision_tower.vision_model.", "vision_tower.vision_model.",
          "model.vision_tower.", "vision_tower.")  # fmt: skip
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.")


def _strip(name: str, prefixes: tuple[str, ...]) -> str | None:
    return next((name[len(p) :] for p in prefixes if name.startswith(p)), None)


def tower_and_projection(model: LlamaModel, w: DeviceWeights, prefixes: tuple[tuple, tuple],
                         build, projection: tuple[str, str, tuple[int, int]]):  # fmt: skip
    """(the tower `build` makes of the tensors under `prefixes[0]`, by their names there; the
    projection matrix `projection[0]` under `prefixes[1]`), on the model's device in its
    dtype; (None, None) on a rank past 0 (rank 0 encodes, the features are broadcast).
    ValueError, one line, for weights that are not in safetensors files, a missing tensor or a
    projection (`projection`: its name, what the message calls it, its shape) of another
    shape."""
    if model.tp is not None and model.tp.rank > 0:
        return None, None
    family = model.config.architecture
    stored = w.stored
    if not hasattr(stored, "tensors_under"):
        raise ValueError(f"a {family} model's vision tower is read from safetensors files")
    held: tuple[dict, dict] = ({}, {})
    for name, t in stored.tensors_under(prefixes[0] + prefixes[1]).items():
        t = t.to(device=model.device, dtype=model.dtype)
        if (p := _strip(name, prefixes[1])) is not None:
            held[1][p] = t
        elif (p := _strip(name, prefixes[0])) is not None:
            held[0][p] = t
    try:
        tower = build(held[0])
    except KeyError as e:
        raise ValueError(f"the {family} checkpoint lacks the vision tensor {e.args[0]!r}") from None
    key, label, want = projection
    proj = held[1].get(key)
    if proj is None or tuple(proj.shape) != want:
        got = "none" if proj is None else list(proj.shape)
        raise ValueError(f"the {label} is {got}, not {list(want)}")
    return tower, proj


def _read(name: str, layers_run: int) -> bool:
    """Whether the tower's tensor `name` is held: not the post-norm nor a layer after the one
    whose output is read (`VisionConfig.layers_run`)."""
    if name.startswith("post_layernorm."):
        return False
    m = _LAYER.match(name)
    return m is None or int(m.group(1)) < layers_run


class LlavaModel(LlamaModel):
    def tower_config(self) -> VisionConfig:
        """The tower's and projector's config (LLaVA-NeXT's sits inside its image config)."""
        return self.config.vision

    def build_tower(self, tensors: dict[str, torch.Tensor], vision: VisionConfig):
        return ClipVisionTower(tensors, vision)

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        if self.config.vision is None:
            raise ValueError("a LLaVA model needs its vision_config (config.json)")
        vision = self.tower_config()
        self.tower = None
        if self.tp is not None and self.tp.rank > 0:  # rank 0 encodes; features broadcast
            return
        stored = w.stored
        if not hasattr(stored, "tensors_under"):
            raise ValueError("a LLaVA model's vision tower is read from safetensors files")
        raw = stored.tensors_under(_TOWER + _PROJECTOR)
        tower, projector = {}, {}
        for name, t in raw.items():
            p = _strip(name, _PROJECTOR)
            if p is not None:
                projector[p] = t.to(device=self.device, dtype=self.dtype)
            elif _read(p := _strip(name, _TOWER), vision.layers_run):
                tower[p] = t.to(device=self.device, dtype=self.dtype)
        try:
            self.tower = self.build_tower(tower, vision)
            self.linear_1 = (projector["linear_1.weight"], projector.get("linear_1.bias"))
            self.linear_2 = (projector["linear_2.weight"], projector.get("linear_2.bias"))
        except KeyError as e:
            raise ValueError(
                f"the LLaVA checkpoint lacks the vision tensor {e.args[0]!r}"
            ) from None
        if self.linear_2[0].shape[0] != self.config.hidden_size:
            raise ValueError(f"the projector gives {self.linear_2[0].shape[0]} features, the "
                             f"text model reads {self.config.hidden_size}")  # fmt: skip

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """The tower's rows [N, T, D] → the text model's features (the class token dropped
        with the "default" strategy), through the 2-layer projector."""
        vision = self.tower_config()
        if vision.select_strategy == "default":
            h = h[:, 1:]
        h = activation(vision.projector_act, F.linear(h, *self.linear_1))
        return F.linear(h, *self.linear_2)

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] preprocessed pixels → [N, tokens_per_image, hidden] image features."""
        return self.project(self.tower(pixel_values))
