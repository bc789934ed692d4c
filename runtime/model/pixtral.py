"""Mistral 3 (`Mistral3ForConditionalGeneration`: Mistral-Small-3.1) and LLaVA-Pixtral
(`LlavaForConditionalGeneration` with a `pixtral` vision_config: pixtral-12b): the Pixtral
vision tower (`pixtral_vision.py`), its projector, and the Mistral text model (Llama's layers).

`encode_image_list` turns each image's pixels into the rows of its whole run in the prompt
(`multimodal/pixtral_inputs.py`): the tower's features at `vision_feature_layer`, projected
(Mistral 3: RMSNorm, the `spatial_merge_size`^2 neighbours of a patch merged into one row,
linear-GELU-linear; LLaVA: linear-act-linear) to the text model's width, row by row of the merged
grid, each row followed by the embedding of `[IMG_BREAK]` (the last by `[IMG_END]`'s): the rows
the runner scatters over the run are then exactly the input transformers builds there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.pixtral_vision import PixtralVisionTower, rms_norm

# stored prefix -> this module's (transformers 4's and 5's names)
_TOWER = ("model.vision_tower.", "vision_tower.")
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")
_ACT = {"silu": F.silu, "gelu": F.gelu}


def merge_patches(x: torch.Tensor, rows: int, cols: int, m: int) -> torch.Tensor:
    """[rows * cols, D] patch features → [rows/m * cols/m, D * m * m]: each m x m block of the
    grid one row, (feature, block row, block column) within it (transformers' `unfold`)."""
    d = x.shape[-1]
    x = x.view(rows // m, m, cols // m, m, d).permute(0, 2, 4, 1, 3)
    return x.reshape((rows // m) * (cols // m), d * m * m)


class PixtralModel(LlamaModel):
    ragged_images = True  # `mm_encoder.device_step`: images of their own sizes, as a list

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        vision = self.config.vision
        marks = torch.tensor([vision.break_token, vision.end_token], device=self.device)
        self.marks = self.embed_tokens(marks)  # [IMG_BREAK]'s and [IMG_END]'s rows (all ranks)
        self.tower = None
        if self.tp is not None and self.tp.rank > 0:  # rank 0 encodes; features broadcast
            return
        stored = w.stored
        if not hasattr(stored, "tensors_under"):
            raise ValueError("a Pixtral model's vision tower is read from safetensors files")
        tower, projector = {}, {}
        for name, t in stored.tensors_under(_TOWER + _PROJECTOR).items():
            if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                raise ValueError(f"the vision tensor {name!r} is {t.dtype}: the tower and "
                                 "projector are read in 16 or 32 bits")  # fmt: skip
            into, prefixes = (
                (projector, _PROJECTOR) if name.startswith(_PROJECTOR) else (tower, _TOWER)
            )
            key = next(name[len(p) :] for p in prefixes if name.startswith(p))
            into[key] = t.to(device=self.device, dtype=self.dtype)
        try:
            self.tower = PixtralVisionTower(tower, vision)
            self.linear_1 = (projector["linear_1.weight"], projector.get("linear_1.bias"))
            self.linear_2 = (projector["linear_2.weight"], projector.get("linear_2.bias"))
            if vision.projector == "mistral3":
                self.projector_norm = projector["norm.weight"]
                self.merging = projector["patch_merger.merging_layer.weight"]
        except KeyError as e:
            raise ValueError(f"the checkpoint lacks the vision tensor {e.args[0]!r}") from None
        if self.linear_2[0].shape[0] != self.config.hidden_size:
            raise ValueError(f"the projector gives {self.linear_2[0].shape[0]} features, the "
                             f"text model reads {self.config.hidden_size}")  # fmt: skip

    @torch.inference_mode()
    def encode_image_list(self, pixels: list[torch.Tensor], grids: list) -> list[torch.Tensor]:
        """Each image's pixels [3, H, W] → the rows of its run [rows * (cols + 1), hidden], in
        one pass through the tower."""
        v = self.config.vision
        h, patch_grids = self.tower(pixels)
        sizes = (patch_grids[:, 0] * patch_grids[:, 1]).tolist()
        if v.projector == "mistral3":
            h = rms_norm(h, self.projector_norm, self.config.rms_norm_eps)
            h = torch.cat([merge_patches(x, r, c, v.merge_size)
                           for x, (r, c) in zip(h.split(sizes), patch_grids.tolist())])  # fmt: skip
            h = F.linear(h, self.merging)
        h = F.linear(_ACT[v.projector_act](F.linear(h, *self.linear_1)), *self.linear_2)
        out = []
        for x, (_, rows, cols) in zip(h.split([s // v.merge_size**2 for s in sizes]), grids):
            marks = self.marks[0].expand(rows, 1, -1).clone()
            marks[-1, 0] = self.marks[1]
            out.append(torch.cat([x.view(rows, cols, -1), marks.to(x.dtype)], 1).flatten(0, 1))
        return out
