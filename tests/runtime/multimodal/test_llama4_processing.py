"""Llama 4's preprocessing in PIL + NumPy (`multimodal/llama4_processing.py`) against
transformers' `Llama4ImageProcessor`: exactly its tiles and grid. The class runs on torchvision,
which this project does not install: where torchvision is importable the tiles are compared
with the class itself over random images of many sizes and modes; everywhere they are compared
with its recorded outputs (transformers 5.25, torchvision 0.28: each case's grid and the
SHA-256 of its float32 pixels). The resize is compared with torch's antialiased bilinear
interpolate of uint8 images (what torchvision's resize runs) on random sizes, up and down."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
import torch
from llama4_vision_testlib import MAX_PATCHES, TILE, has_torchvision, image, image_processor
from pagoda.runtime.multimodal.llama4_processing import (
    Llama4Processing,
    canvases,
    preprocess,
    resize_uint8,
    to_bf16,
)
from pagoda.runtime.multimodal.llama4_vision_config import read_llama4_vision

# (seed, (height, width), mode, processor settings) -> transformers' (rows, cols), sha256[:16]
RECORDED = [
    (0, (40, 52), "RGB", {}, (1, 1), "a90abac2592d2196"),
    (1, (150, 60), "RGB", {}, (3, 1), "6d3df4b813474bd0"),
    (2, (20, 25), "RGBA", {}, (1, 1), "02f98d860cd6595c"),
    (3, (130, 170), "L", {}, (2, 2), "9c5edfac43be47c1"),
    (4, (61, 200), "RGB", {"resize_to_max_canvas": True}, (1, 4), "b1370e4f48a8eb98"),
    (5, (300, 90), "RGB", {"max_patches": 9}, (4, 2), "2e2f9be8f837c345"),
    (6, (56, 56), "RGB", {}, (1, 1), "e190697316f85e32"),
    (7, (9, 300), "RGB", {}, (1, 4), "eb9998c38c52d753"),
]


def _ours(kw: dict) -> Llama4Processing:
    return Llama4Processing(tile=TILE, max_patches=kw.get("max_patches", MAX_PATCHES),
                            resize_to_max_canvas=kw.get("resize_to_max_canvas", False))  # fmt: skip


@pytest.mark.parametrize("case", RECORDED, ids=lambda c: f"{c[1][0]}x{c[1][1]}-{c[2]}")
def test_tiles_are_transformers_recorded_outputs(case):
    seed, size, mode, kw, grid, digest = case
    tiles, rows, cols = preprocess(image(seed, size, mode), _ours(kw))
    assert (rows, cols) == grid
    assert tiles.shape == (rows * cols + (rows * cols > 1), 3, TILE, TILE)
    assert tiles.dtype == np.float32 and tiles.flags.c_contiguous
    assert hashlib.sha256(tiles.tobytes()).hexdigest()[:16] == digest


@pytest.mark.skipif(
    not has_torchvision(), reason="transformers' Llama4ImageProcessor needs torchvision"
)
@pytest.mark.parametrize("kw", [{}, {"resize_to_max_canvas": True}, {"max_patches": 9}])
def test_tiles_are_transformers_llama4_image_processor(kw):
    rng = np.random.default_rng(len(kw))
    theirs = image_processor(**kw)
    for t in range(30):
        size = tuple(int(x) for x in rng.integers(1, 5 * TILE, 2))
        im = image(t, size, ("RGB", "RGBA", "L")[t % 3])
        want = theirs(im, return_tensors="pt")
        tiles, rows, cols = preprocess(im, _ours(kw))
        assert [rows, cols] == want["aspect_ratios"][0].tolist()
        np.testing.assert_allclose(tiles, want["pixel_values"].float().numpy(), atol=1e-6, rtol=0)


@pytest.mark.skipif(
    not has_torchvision(), reason="transformers' Llama4ImageProcessor needs torchvision"
)
def test_canvases_are_find_supported_resolutions():
    from transformers.image_utils import SizeDict
    from transformers.models.llama4.image_processing_llama4 import find_supported_resolutions

    for n in (1, 4, 9, 16):
        want = find_supported_resolutions.__wrapped__(n, SizeDict(height=7, width=7))
        assert [(r * 7, c * 7) for r, c in canvases(n)] == want


def test_canvases_by_aspect_from_the_most_tiles():
    """transformers' order (its docstring's example of 4 tiles): by aspect ratio as first met
    from the most tiles down, each ratio's grids from the most tiles."""
    assert canvases(4) == [(1, 4), (2, 2), (1, 1), (4, 1), (1, 3), (3, 1), (1, 2), (2, 1)]


def test_resize_is_torchs_antialiased_uint8_interpolate():
    rng = np.random.default_rng(0)
    for _ in range(60):
        h, w, oh, ow = (int(x) for x in rng.integers(1, 150, 4))
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        x = torch.from_numpy(a).permute(2, 0, 1)[None]
        want = torch.nn.functional.interpolate(x, size=(oh, ow), mode="bilinear",
                                               antialias=True, align_corners=False)  # fmt: skip
        assert np.array_equal(resize_uint8(a, oh, ow), want[0].permute(1, 2, 0).numpy())


def test_bf16_rounding_is_torchs():
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32) * 3
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(to_bf16(x), want)


@pytest.mark.parametrize(
    ("pre", "match"),
    [
        ({"resample": 3}, "resample 3 is not supported"),
        ({"do_normalize": False}, "do_normalize False"),
        ({"size": {"height": 56, "width": 28}}, "not a square"),
        ({"image_processor_type": "CLIPImageProcessor"}, "not supported"),
        ({"size": {"height": 28, "width": 28}}, "is not the tower's image_size"),
    ],
)
def test_what_the_processor_does_not_run_is_refused(tmp_path, pre, match):
    from llama4_vision_testlib import PATCH_ID, VISION, write_processor_files

    write_processor_files(tmp_path, **pre)
    top = {"vision_config": {**VISION, "model_type": "llama4_vision_model"},
           "image_token_index": PATCH_ID}  # fmt: skip
    with pytest.raises(ValueError, match=match):
        read_llama4_vision(top, tmp_path)


def test_the_checkpoints_tokens_and_processor_are_checked(tmp_path):
    from llama4_vision_testlib import PATCH_ID, VISION, write_processor_files

    top = {"vision_config": {**VISION, "model_type": "llama4_vision_model"},
           "image_token_index": PATCH_ID}  # fmt: skip
    assert read_llama4_vision(top, tmp_path) is None  # no tokenizer.json: text only
    write_processor_files(tmp_path)
    vision = read_llama4_vision(top, tmp_path)
    assert vision.tokens_per_image == 16 and vision.processing.max_patches == MAX_PATCHES
    fp8 = {"quant_method": "fbgemm_fp8"}  # (Maverick's FP8 release): read text-only
    assert read_llama4_vision({**top, "quantization_config": fp8}, tmp_path) is None
    with pytest.raises(ValueError, match=re.escape("is not the tokenizer's <|patch|>")):
        read_llama4_vision({**top, "image_token_index": 5}, tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"patch_size": 14}))
    with pytest.raises(ValueError, match=re.escape("writes 4 <|patch|> tokens a tile")):
        read_llama4_vision(top, tmp_path)
