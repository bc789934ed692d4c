"""`multimodal.anyres_processing.preprocess` (PIL + NumPy) against transformers'
`LlavaNextImageProcessor` and `LlavaOnevisionImageProcessor` (their PIL backends: the classes
transformers gives without torchvision) on the same images: landscape, portrait, smaller than a
crop, a long strip, a transparent RGBA and a grayscale one; llava-hf's 336 px / 384 px settings
and a tiny one. The crops, their order and the image sizes are the processors'."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pagoda.runtime.multimodal.anyres_config import read_anyres
from pagoda.runtime.multimodal.anyres_processing import num_crops, preprocess
from PIL import Image

transformers = pytest.importorskip("transformers")
_CLIP = {"model_type": "clip_vision_model", "patch_size": 14, "image_size": 336}
_SIGLIP = {"model_type": "siglip_vision_model", "patch_size": 14, "image_size": 384}


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))  # noqa: E731
    rgba = Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA")
    gray = Image.fromarray(rng.integers(0, 256, (61, 45), dtype=np.uint8), "L")
    return [rgb(300, 500), rgb(700, 260), rgb(20, 25), rgb(90, 1000), rgba, gray]


def _processors():
    from transformers.models.llava_next.image_processing_pil_llava_next import (
        LlavaNextImageProcessorPil,
    )
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tiny = [[30, 60], [60, 30], [60, 60], [90, 30], [30, 90]]
    return [
        ("llava_next", {"vision_config": _CLIP}, LlavaNextImageProcessorPil(
            size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336})),
        ("llava_next", {"vision_config": {**_CLIP, "image_size": 30, "patch_size": 10},
                        "image_grid_pinpoints": tiny},
         LlavaNextImageProcessorPil(size={"shortest_edge": 30},
                                    crop_size={"height": 30, "width": 30},
                                    image_grid_pinpoints=tiny)),
        ("llava_onevision", {"vision_config": _SIGLIP}, LlavaOnevisionImageProcessorPil(
            size={"height": 384, "width": 384}, image_mean=[0.5] * 3, image_std=[0.5] * 3)),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(3))
def test_crops_are_the_processors(tmp_path, case):
    kind, top, hf = _processors()[case]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(hf.to_dict()))
    vision = read_anyres(kind, top, tmp_path)
    for im in _images():
        want = hf(im, return_tensors="np")
        got, size = preprocess(im, vision)
        assert size == tuple(want["image_sizes"][0]) == (im.height, im.width)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert got.shape == want["pixel_values"][0].shape
        assert len(got) == num_crops(im.height, im.width, vision)
        np.testing.assert_allclose(got, want["pixel_values"][0], rtol=0, atol=1e-6)


def test_another_processor_is_refused(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "CLIPImageProcessor"})
    )
    with pytest.raises(ValueError, match="CLIPImageProcessor' is not supported for llava_next"):
        read_anyres("llava_next", {"vision_config": _CLIP}, tmp_path)
