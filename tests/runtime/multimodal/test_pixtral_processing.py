"""`multimodal.pixtral_processing`, `pixtral_config` and `pixtral_inputs` against transformers:
the pixels of `PixtralImageProcessor` (its PIL backend, as PixtralProcessor runs it) on
landscape, portrait, small, transparent, grey and oversized images; the expanded prompt
`PixtralProcessor` writes (`[IMG]` rows, `[IMG_BREAK]`, `[IMG_END]`); the config read from a
Mistral 3 and a LLaVA-Pixtral config.json; and what `check` and `build` refuse."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pagoda.runtime.multimodal import inputs
from pagoda.runtime.multimodal.pixtral_config import read_pixtral
from pagoda.runtime.multimodal.pixtral_processing import (
    PixtralImageProcessing,
    preprocess,
    resized_shape,
)
from PIL import Image
from pixtral_testlib import BREAK, END, IMAGE_ID, image_processor, pixtral_processor, tokenizer

transformers = pytest.importorskip("transformers")
from transformers.models.pixtral import image_processing_pil_pixtral as hf_pil  # noqa: E402

PIXTRAL = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 48,
           "num_attention_heads": 2, "num_hidden_layers": 2, "patch_size": 8,
           "hidden_act": "silu"}  # fmt: skip
TEXT = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 300, "head_dim": 16,
        "num_key_value_heads": 2, "sliding_window": None}  # fmt: skip


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))  # noqa: E731
    rgba = Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA")
    gray = Image.fromarray(rng.integers(0, 256, (61, 45), dtype=np.uint8), "L")
    return [rgb(40, 52), rgb(97, 33), rgb(9, 20), rgba, gray, rgb(300, 410), rgb(64, 64)]


@pytest.mark.parametrize("kind", ["mistral3", "llava"])
def test_pixels_are_pixtral_image_processors(kind):
    hf = image_processor(kind)
    ours = PixtralImageProcessing.from_json(hf.to_dict(), hf.patch_size["height"])
    for im in _images():
        want = hf(im, return_tensors="np")
        got = preprocess(im, ours)
        assert tuple(want["image_sizes"][0]) == got.shape[1:]
        assert got.dtype == np.float32 and got.shape == want["pixel_values"].shape[1:]
        np.testing.assert_allclose(got, want["pixel_values"][0], rtol=0, atol=1e-6)


def test_resized_shape_is_transformers():
    p = PixtralImageProcessing(max_size=(1540, 1540), patch=28)
    for h, w in [(40, 52), (1000, 30), (5, 7), (3000, 4000), (1540, 1541), (28, 28)]:
        want = hf_pil.get_resize_output_image_size(np.zeros((h, w, 3)), (1540, 1540), (28, 28))
        assert resized_shape(h, w, p) == want


def _write(path, kind: str, **top) -> None:
    if kind == "mistral3":
        cfg = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
               "spatial_merge_size": 2, "image_token_index": IMAGE_ID}  # fmt: skip
    else:
        cfg = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
               "image_token_index": IMAGE_ID, "vision_feature_layer": -1,
               "vision_feature_select_strategy": "full"}  # fmt: skip
    cfg |= {"vision_config": PIXTRAL, "text_config": TEXT} | top
    (path / "config.json").write_text(json.dumps(cfg))
    image_processor(kind).save_pretrained(path)
    tokenizer(path)


@pytest.mark.parametrize("kind", ["mistral3", "llava"])
def test_the_expanded_prompt_is_pixtral_processors(tmp_path, kind):
    _write(tmp_path, kind)
    vision = read_pixtral(json.loads((tmp_path / "config.json").read_text()), tmp_path)
    assert (vision.break_token, vision.end_token) == (BREAK, END)
    assert vision.projector == kind and vision.merge_size == (2 if kind == "mistral3" else 1)
    proc = pixtral_processor(kind, tokenizer())
    ims = _images()[:3]
    text = "w1 w5 [IMG] w6 [IMG] [IMG] w7"
    want = proc(text=text, images=ims, return_tensors="np")
    ids, mm = inputs.from_images([1, 5, IMAGE_ID, 6, IMAGE_ID, IMAGE_ID, 7], ims, vision)
    assert ids == want["input_ids"][0].tolist()
    for im, size in zip(mm.images, want["image_sizes"]):
        f = vision.processing.patch
        assert im.grid == (1, size[0] // f, size[1] // f)
        assert im.length == im.grid[1] * (im.grid[2] + 1) and ids[im.end - 1] == END
    inputs.check(ids, mm, vision, limit=3)
    with pytest.raises(ValueError, match="at prompt positions"):
        inputs.check(ids[:-3] + [IMAGE_ID] * 3, mm, vision, limit=3)
    with pytest.raises(ValueError, match="2 image token"):
        inputs.from_images([1, IMAGE_ID, IMAGE_ID], ims[:1], vision)
    with pytest.raises(ValueError, match="depend on each image's size"):
        inputs.expand([1, IMAGE_ID], 1, vision)


def test_configs_read_and_refused(tmp_path):
    from pagoda.runtime.model.loader import read_model_config

    _write(tmp_path, "mistral3")
    mc = read_model_config(str(tmp_path))
    assert mc.architecture == "mistral3" and mc.vision.processing.max_size == (64, 64)
    assert mc.vision.feature_layer == -1 and not mc.vision.projector_bias
    (tmp_path / "tokenizer.json").unlink()  # no [IMG_BREAK] to name: read text-only
    assert (
        read_model_config(str(tmp_path)).architecture == "mistral" and not mc.vision.bidirectional
    )
    _write(tmp_path, "llava", vision_feature_select_strategy="default")
    with pytest.raises(ValueError, match="vision_feature_select_strategy 'default'"):
        read_model_config(str(tmp_path))
    _write(tmp_path, "llava", text_config={**TEXT, "sliding_window": 4096})
    with pytest.raises(ValueError, match="sliding_window 4096"):
        read_model_config(str(tmp_path))
    _write(tmp_path, "llava")
    assert read_model_config(str(tmp_path)).architecture == "llava"
    (tmp_path / "tokenizer.json").unlink()  # LLaVA's text model is not served without images
    with pytest.raises(ValueError, match=r"needs the tokenizer.json naming \[IMG_BREAK\]"):
        read_model_config(str(tmp_path))
    tokenizer(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "PixtralImageProcessor", "do_center_crop": True}))  # fmt: skip
    with pytest.raises(ValueError, match="do_center_crop"):
        read_model_config(str(tmp_path))


def test_mistral_small_3_1s_published_config_reads_as_transformers(tmp_path):
    """Mistral-Small-3.1-24B-Instruct-2503's config.json and preprocessor_config.json (its
    vision side): 28 px merged patches, 1540 px longest edge, the processor's break and end
    tokens; the weights estimate is transformers' tower and projector (built on `meta`)."""
    import torch
    from transformers.models.mistral3 import modeling_mistral3
    from transformers.models.pixtral import modeling_pixtral

    vision = {"head_dim": 64, "hidden_act": "silu", "hidden_size": 1024, "image_size": 1540,
              "intermediate_size": 4096, "model_type": "pixtral", "num_attention_heads": 16,
              "num_channels": 3, "num_hidden_layers": 24, "patch_size": 14,
              "rope_theta": 10000.0}  # fmt: skip
    text = {**TEXT, "hidden_size": 5120, "head_dim": 128, "rms_norm_eps": 1e-05}
    top = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
           "image_token_index": 10, "multimodal_projector_bias": False,
           "projector_hidden_act": "gelu", "spatial_merge_size": 2, "vision_feature_layer": -1,
           "vision_config": vision, "text_config": text}  # fmt: skip
    pre = {"image_processor_type": "PixtralImageProcessorFast", "do_center_crop": None,
           "patch_size": {"height": 14, "width": 14}, "resample": 3,
           "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}}  # fmt: skip
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    tokenizer(tmp_path)
    v = read_pixtral(top, tmp_path)
    assert (v.processing.patch, v.processing.max_size, v.merge_size) == (28, (1540, 1540), 2)
    assert (v.image_token_index, v.break_token, v.end_token, v.hidden_act) == (10, 12, 13, "silu")
    config = transformers.Mistral3Config(**{k: top[k] for k in top if k != "architectures"})
    with torch.device("meta"):
        tower = modeling_pixtral.PixtralVisionModel(config.vision_config)
        projector = modeling_mistral3.Mistral3MultiModalProjector(config)
    count = sum(p.numel() for m in (tower, projector) for p in m.parameters())
    assert v.num_params(5120) == count
