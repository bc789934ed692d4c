"""Qwen3-VL's image side (`Qwen3VLForConditionalGeneration`, `Qwen3VLMoeForConditionalGeneration`),
read once from config.json's `vision_config` and the processor beside the checkpoint (plain
data: the API process reads it too, no torch), as a `QwenVisionConfig` of kind "qwen3_vl".

Its tower (`model/qwen3_vl_vision.py`): a Conv3d patch embedding with a bias, a learned table
of `num_position_embeddings` positions (a square grid) resampled to each image's grid,
LayerNorm blocks with a `hidden_act` MLP (gelu_pytorch_tanh), the 2-D rotary and full
attention of Qwen2-VL's, a LayerNorm merger into `out_hidden_size`, and DeepStack: after each
block of `deepstack_visual_indexes`, a merger of its own (its LayerNorm over the merged
features) whose output is added to the image rows of the text model's first layers. The
text rotary's `mrope_section` is interleaved (`mrope_interleaved`). The images go through
`Qwen2VLImageProcessor` (16 px patches in Qwen3-VL's checkpoints); the prompt's image runs
and M-RoPE positions are Qwen2-VL's (`qwen2_vl_inputs.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagoda.runtime.multimodal.config import processor_json
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig, mrope_section
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing

# the processor Qwen3-VL's checkpoints publish (Qwen2VLImageProcessor's fields), for a
# checkpoint saved without one
PUBLISHED = QwenImageProcessing(min_pixels=65_536, max_pixels=16_777_216, patch_size=16,
                                mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))  # fmt: skip
ACTS = ("gelu_pytorch_tanh", "gelu", "silu", "quick_gelu")


def read_qwen3_vl(top: dict[str, Any], model_dir: Path | None) -> QwenVisionConfig:
    """A Qwen3-VL config.json's image side; ValueError, one line, on a bad one."""
    v = top.get("vision_config") or {}
    cfg = None if model_dir is None else processor_json(model_dir)
    act = v.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTS:
        raise ValueError(f"vision_config.hidden_act {act!r} is not supported "
                         f"(supported: {', '.join(ACTS)})")  # fmt: skip
    return QwenVisionConfig(
        kind="qwen3_vl",
        width=int(v.get("hidden_size", 1152)),
        intermediate_size=int(v.get("intermediate_size", 4304)),
        depth=int(v.get("depth", 27)),
        num_heads=int(v.get("num_heads", 16)),
        out_size=int(v.get("out_hidden_size", 3584)),
        patch_size=int(v.get("patch_size", 16)),
        temporal_patch_size=int(v.get("temporal_patch_size", 2)),
        merge_size=int(v.get("spatial_merge_size", 2)),
        image_token_index=int(top.get("image_token_id", 151655)),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        hidden_act=act,
        mrope_section=mrope_section(top, default=(24, 20, 20)),
        processing=PUBLISHED if cfg is None else QwenImageProcessing.from_json(cfg),
        pos_embeddings=int(v.get("num_position_embeddings", 2304)),
        deepstack=tuple(int(i) for i in v.get("deepstack_visual_indexes", (8, 16, 24))),
        mrope_interleaved=True,  # (transformers interleaves whatever `mrope_interleaved` says)
    )
