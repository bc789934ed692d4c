"""Tiny random-weight Qwen3-VL and Qwen3-VL-MoE written by transformers (a 3-block tower 32
wide, 8 px patches merged 2x2, a 4 x 4 learned position table, DeepStack after blocks 0 and 2;
a 3-layer Qwen3 text model of 300 tokens, interleaved M-RoPE sections (2, 3, 3); the MoE's
4 experts, top 2), saved with a Qwen2VLImageProcessor of 8 px patches, 256 to 16384 pixels
and Qwen3-VL's mean and std 0.5, and Qwen2-VL's tiny tokenizer (`qwen2_vl_testlib`).
Imported by tests (not a conftest)."""

from __future__ import annotations

import torch
from hf_oracle import TINY
from qwen2_vl_testlib import END, IMAGE_ID, START, VIDEO_ID, random_model, save_all

PROCESSOR = {"min_pixels": 256, "max_pixels": 16384, "patch_size": 8,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
VISION = dict(depth=3, hidden_size=32, intermediate_size=48, out_hidden_size=64, num_heads=2,
              patch_size=8, num_position_embeddings=16, deepstack_visual_indexes=[0, 2])  # fmt: skip
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)


def make_tiny_qwen3_vl(path, kind: str = "qwen3_vl"):
    """The model (float32, eval) saved to `path` with its image processor and a tokenizer
    (`kind`: "qwen3_vl" or "qwen3_vl_moe"); returns the model."""
    import transformers

    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
            "mrope_interleaved": True}  # fmt: skip
    # (eos 299: transformers generate stops at its eos; the engine runs ignore_eos)
    text = {
        **TINY,
        "num_hidden_layers": 3,
        "head_dim": 16,
        "rope_parameters": rope,
        "eos_token_id": 299,
    }
    ids = dict(image_token_id=IMAGE_ID, vision_start_token_id=START, vision_end_token_id=END,
               video_token_id=VIDEO_ID, tie_word_embeddings=False)  # fmt: skip
    if kind == "qwen3_vl":
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=VISION, **ids)
        cls = transformers.Qwen3VLForConditionalGeneration
    else:
        config = transformers.Qwen3VLMoeConfig(text_config={**text, **MOE},
                                               vision_config=VISION, **ids)  # fmt: skip
        cls = transformers.Qwen3VLMoeForConditionalGeneration
    model = random_model(cls, config)
    with torch.no_grad():  # (positions as large as the patches: a misplaced row changes tokens)
        model.model.visual.pos_embed.weight.mul_(50.0)
    save_all(model, path, PROCESSOR)
    return model
