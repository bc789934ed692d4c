"""Qwen2-VL and Qwen2.5-VL (`Qwen2VLForConditionalGeneration`,
`Qwen2_5_VLForConditionalGeneration`): the vision tower (`qwen2_vl_vision.py`) beside Qwen2's
text model (Llama's layers with q/k/v biases) whose rotary is M-RoPE.

M-RoPE: a token's rotary reads three positions (temporal, height, width), the head's frequencies
split in `mrope_section` parts, part i turned by position i (Qwen3-VL's, `qwen3_vl.py`: the
parts interleaved, `mrope_selector`). Text and generated tokens have the
three equal, so a step with no prompt image rows runs the ordinary rotary at position + the
request's delta (`worker/mrope_rows.py` sets the positions); a step with image rows carries
their [3, T] positions (`MROPE_POSITIONS`) and the cos/sin rows are gathered per section here,
then handed to the rotary as a table of one row per token (positions 0..T-1). With tensor
parallelism rank 0 alone holds the tower; the other ranks receive the step's image features
and [3, T] positions from it (`worker/step_channel.py`).
"""

from __future__ import annotations

import numpy as np
import torch
from pagoda.runtime.model.device_weights import DeviceWeights
from pagoda.runtime.model.llama import LayerContext, LlamaModel
from pagoda.runtime.model.ops import gather_cos_sin
from pagoda.runtime.model.qwen2_vl_vision import QwenVisionTower

MROPE_POSITIONS = "mrope_positions"
_TOWER = ("model.visual.", "visual.")


def mrope_selector(section: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """int64 [half]: the axis (0 t, 1 h, 2 w) that turns each rotary frequency: three runs of
    `section`, or (Qwen3-VL's) interleaved t, h, w, t, h, w, ... while h's and w's last."""
    half = sum(section)
    if not interleaved:
        return np.repeat(np.arange(3), section)
    j = np.arange(half)
    sel = np.zeros(half, dtype=np.int64)
    sel[(j % 3 == 1) & (j < 3 * section[1])] = 1
    sel[(j % 3 == 2) & (j < 3 * section[2])] = 2
    return sel


class Qwen2VLModel(LlamaModel):
    ragged_images = True  # `mm_encoder.device_step`: images of their own sizes, as a list
    tower_class = QwenVisionTower
    name = "Qwen2-VL"

    def read_model_tensors(self, w: DeviceWeights, ctx: LayerContext) -> None:
        vision = self.config.vision
        half = self.config.head_dim // 2
        if sum(vision.mrope_section) != half:
            raise ValueError(f"mrope_section {list(vision.mrope_section)} does not sum to half "
                             f"the head ({half})")  # fmt: skip
        sel = mrope_selector(vision.mrope_section, vision.mrope_interleaved)
        self.mrope_sel = torch.from_numpy(np.concatenate([sel, sel])).to(self.device)
        self.tower = None
        if self.tp is not None and self.tp.rank > 0:  # rank 0 encodes; features and M-RoPE
            return  # positions broadcast (`worker/step_channel.py`)
        stored = w.stored
        if not hasattr(stored, "tensors_under"):
            raise ValueError(f"a {self.name} model's vision tower is read from safetensors files")
        raw = stored.tensors_under(_TOWER)
        tower = {}
        for name, t in raw.items():
            p = next(name[len(x) :] for x in _TOWER if name.startswith(x))
            tower[p] = t.to(device=self.device, dtype=self.dtype)
        try:
            self.tower = self.tower_class(tower, vision)
        except KeyError as e:
            raise ValueError(f"the {self.name} checkpoint lacks the vision tensor "
                             f"'visual.{e.args[0]}'") from None  # fmt: skip

    @torch.inference_mode()
    def encode_image_list(self, patches: list[torch.Tensor], grids: list) -> list[torch.Tensor]:
        """Each image's patches → its merged features, in one pass through the tower."""
        feats = self.tower.encode(torch.cat(patches), np.asarray(grids, dtype=np.int64))
        sizes = [len(p) // self.config.vision.merge_size**2 for p in patches]
        return list(feats.split(sizes))

    def _rope_rows(self, positions: torch.Tensor, dtype: torch.dtype, meta) -> dict:
        mrope = meta.aux.get(MROPE_POSITIONS)
        if mrope is None:  # no prompt image rows: the ordinary rotary at position + delta
            return super()._rope_rows(positions, dtype, meta)
        cache = self.rope_caches["global"]
        rows = cache[mrope]  # [3, T, D]
        sel = self.mrope_sel[None, None, :].expand(1, rows.shape[1], -1)
        rows = rows.gather(0, sel)[0]
        t = torch.arange(rows.shape[0], device=rows.device)
        if self.ops.pregather_rotary:
            return {"global": (None, gather_cos_sin(t, rows, dtype))}
        return {"global": (t, rows)}
