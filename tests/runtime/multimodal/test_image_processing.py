"""`multimodal.image_processing.preprocess` (PIL + NumPy) against transformers'
`CLIPImageProcessor` on the same images: landscape, portrait, smaller than the crop, a
transparent RGBA, grayscale, palette; LLaVA-1.5's 336 px settings and a tiny one."""

from __future__ import annotations

import numpy as np
import pytest
from pagoda.runtime.multimodal.config import ImageProcessing, VisionConfig, read_llava
from pagoda.runtime.multimodal.image_processing import preprocess
from PIL import Image

transformers = pytest.importorskip("transformers")


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))  # noqa: E731
    rgba = Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA")
    gray = Image.fromarray(rng.integers(0, 256, (61, 45), dtype=np.uint8), "L")
    return [rgb(40, 52), rgb(97, 33), rgb(20, 25), rgba, gray, rgb(64, 64).convert("P")]


@pytest.mark.parametrize("size", [30, 336])
def test_pixels_are_clip_image_processors(size):
    cfg = {"size": {"shortest_edge": size}, "crop_size": {"height": size, "width": size},
           "image_processor_type": "CLIPImageProcessor"}  # fmt: skip
    hf = transformers.CLIPImageProcessor(**cfg)
    ours = ImageProcessing.from_json(hf.to_dict())
    for im in _images():
        want = hf(im, return_tensors="np")["pixel_values"][0]
        got = preprocess(im, ours)
        assert got.dtype == np.float32 and got.shape == (3, size, size)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_processor_config_that_is_not_clips_or_the_towers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="SiglipImageProcessor"):
        ImageProcessing.from_json({"image_processor_type": "SiglipImageProcessor"})
    with pytest.raises(ValueError, match="size"):
        ImageProcessing.from_json({"size": {"height": 30, "width": 30}})
    top = {"vision_config": {"image_size": 30, "patch_size": 10}}
    assert read_llava(top, tmp_path).processing == ImageProcessing(
        shortest_edge=30, crop=(30, 30)
    )  # none saved
    (tmp_path / "preprocessor_config.json").write_text('{"crop_size": 20, "size": 20}')
    with pytest.raises(ValueError, match="crops"):
        read_llava(top, tmp_path)  # not the tower's size


def test_llava_configs_outside_1_5_are_refused():
    with pytest.raises(ValueError, match="only one layer"):
        read_llava({"vision_feature_layer": [-2, -5]}, None)
    with pytest.raises(ValueError, match="siglip"):
        read_llava({"vision_config": {"model_type": "siglip_vision_model"}}, None)
    with pytest.raises(ValueError, match="crops"):
        VisionConfig(32, 64, 2, 4, image_size=30, patch_size=10, image_token_index=5)
