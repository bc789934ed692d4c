"""`multimodal.qwen3_vl_config`: a Qwen3-VL checkpoint's image side as config.json and its
published processor say (the pixels and grids equal transformers' `Qwen2VLImageProcessor` of
those fields, 16 px patches, mean and std 0.5), the published processor where none is saved,
and a bad vision config refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pagoda.runtime.multimodal.qwen2_vl_processing import preprocess
from pagoda.runtime.multimodal.qwen3_vl_config import PUBLISHED, read_qwen3_vl
from PIL import Image

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_pil  # noqa: E402

# Qwen/Qwen3-VL-8B-Instruct's preprocessor_config.json
HUB = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
       "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
       "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
       "image_processor_type": "Qwen2VLImageProcessorFast"}  # fmt: skip
TOP = {"architectures": ["Qwen3VLForConditionalGeneration"], "image_token_id": 151655,
       "text_config": {"rope_parameters": {"mrope_section": [24, 20, 20],
                                           "mrope_interleaved": True, "rope_theta": 5e6}},
       "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                         "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16,
                         "num_position_embeddings": 2304,
                         "deepstack_visual_indexes": [8, 16, 24]}}  # fmt: skip


def test_the_published_processor_is_transformers(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(HUB))
    v = read_qwen3_vl(TOP, tmp_path)
    assert v.processing == PUBLISHED == read_qwen3_vl(TOP, None).processing
    assert (v.kind, v.width, v.out_size, v.deepstack, v.pos_embeddings) == (
        "qwen3_vl", 1152, 4096, (8, 16, 24), 2304)  # fmt: skip
    assert v.mrope_section == (24, 20, 20) and v.mrope_interleaved
    hf = hf_pil.Qwen2VLImageProcessorPil(**{k: v for k, v in HUB.items() if "class" not in k
                                            and "type" not in k})  # fmt: skip
    rng = np.random.default_rng(0)
    for h, w in [(300, 410), (97, 33), (600, 240)]:
        im = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        want = hf(im, return_tensors="np")
        got, grid = preprocess(im, v.processing)
        assert grid == tuple(want["image_grid_thw"][0].tolist())
        np.testing.assert_allclose(got, want["pixel_values"], rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    ("vision", "match"),
    [({"num_position_embeddings": 2300}, "num_position_embeddings"),
     ({"deepstack_visual_indexes": [8, 27]}, "deepstack_visual_indexes"),
     ({"hidden_act": "relu"}, "hidden_act")],
)  # fmt: skip
def test_a_bad_vision_config_is_refused_in_one_line(vision, match):
    top = {**TOP, "vision_config": {**TOP["vision_config"], **vision}}
    with pytest.raises(ValueError, match=match) as e:
        read_qwen3_vl(top, None)
    assert "\n" not in str(e.value)


# the text side of Qwen/Qwen3-VL-8B-Instruct's config.json (transformers 4's keys: rope_theta
# and rope_scaling at the top of text_config), and Qwen3-VL-30B-A3B-Instruct's experts
HUB_TEXT = {"attention_bias": False, "bos_token_id": 151643, "eos_token_id": 151645,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 12288, "max_position_embeddings": 262144,
            "model_type": "qwen3_vl_text", "num_attention_heads": 32, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 5000000,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                             "rope_type": "default"},
            "tie_word_embeddings": False, "vocab_size": 151936}  # fmt: skip
HUB_MOE = {"model_type": "qwen3_vl_moe_text", "hidden_size": 2048, "num_key_value_heads": 4,
           "num_hidden_layers": 48, "intermediate_size": 6144, "num_experts": 128,
           "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "norm_topk_prob": True}  # fmt: skip


@pytest.mark.parametrize("moe", [False, True])
def test_hub_configs_read_as_transformers_reads_them(tmp_path, moe):
    from pagoda.runtime.model.loader import read_model_config

    text = {**HUB_TEXT, **(HUB_MOE if moe else {})}
    arch = "Qwen3VLMoeForConditionalGeneration" if moe else "Qwen3VLForConditionalGeneration"
    vision = {**TOP["vision_config"], "out_hidden_size": text["hidden_size"]}
    cfg = {**TOP, "architectures": [arch], "model_type": "qwen3_vl_moe" if moe else "qwen3_vl",
           "text_config": text, "vision_config": vision, "tie_word_embeddings": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = read_model_config(str(tmp_path))
    hf = transformers.AutoConfig.from_pretrained(tmp_path).text_config
    assert c.architecture == ("qwen3_vl_moe" if moe else "qwen3_vl")
    assert c.rope_theta == hf.rope_parameters["rope_theta"] == 5e6
    assert (c.head_dim, c.num_kv_heads, c.max_position_embeddings) == (
        hf.head_dim, hf.num_key_value_heads, hf.max_position_embeddings)  # fmt: skip
    assert c.family.qk_norm and not c.tie_word_embeddings
    assert c.vision.mrope_section == tuple(hf.rope_parameters["mrope_section"])
    if moe:
        f = c.family
        assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (
            hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size)  # fmt: skip
        assert f.norm_topk_prob and all(f.moe_layers)
