"""`multimodal.qwen2_vl_processing` against transformers: the pixels and grids of
`Qwen2VLImageProcessor` (its PIL backend) on images of several shapes and pixel
bounds, and the M-RoPE positions and delta of `Qwen2VLModel.get_rope_index` for prompts with
zero, one and two images of different sizes; --mm-processor-kwargs' min_pixels / max_pixels
(`multimodal/processor_kwargs.py`) as the same kwargs given to transformers' processor."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from pagoda.runtime.multimodal import inputs, processor_kwargs
from pagoda.runtime.multimodal.qwen2_vl_config import QwenVisionConfig
from pagoda.runtime.multimodal.qwen2_vl_processing import (
    QwenImageProcessing,
    mrope_positions,
    placeholders,
    preprocess,
    smart_resize,
)
from PIL import Image
from qwen2_vl_testlib import PROCESSOR

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_pil  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl as hf_model  # noqa: E402


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    rgb = lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))  # noqa: E731
    rgba = Image.fromarray(rng.integers(0, 256, (50, 70, 4), dtype=np.uint8), "RGBA")
    gray = Image.fromarray(rng.integers(0, 256, (61, 45), dtype=np.uint8), "L")
    return [rgb(40, 52), rgb(97, 33), rgb(20, 25), rgba, gray, rgb(300, 410)]


@pytest.mark.parametrize("bounds", [(56 * 56, 28 * 28 * 1280), (16 * 16, 64 * 64)])
def test_patches_and_grid_are_qwen2_vl_image_processors(bounds):
    lo, hi = bounds
    kw = {"min_pixels": lo, "max_pixels": hi, "patch_size": 8 if lo < 3000 else 14}
    hf = hf_pil.Qwen2VLImageProcessorPil(**kw)  # (the default without torchvision)
    ours = QwenImageProcessing.from_json(hf.to_dict())
    assert (ours.min_pixels, ours.max_pixels, ours.patch_size) == (lo, hi, kw["patch_size"])
    for im in _images():
        want = hf(im, return_tensors="np")
        got, grid = preprocess(im, ours)
        assert grid == tuple(want["image_grid_thw"][0].tolist())
        assert got.dtype == np.float32 and got.shape == want["pixel_values"].shape
        np.testing.assert_allclose(got, want["pixel_values"], rtol=0, atol=2e-6)
        assert placeholders(grid, ours.merge_size) == got.shape[0] // ours.merge_size**2


def test_smart_resize_is_transformers():
    for h, w in [(40, 52), (1000, 30), (5, 7), (3000, 4000), (28, 28)]:
        for lo, hi in [(56 * 56, 28 * 28 * 1280), (100, 2000)]:
            assert smart_resize(h, w, 28, lo, hi) == hf_pil.smart_resize(h, w, 28, lo, hi)
    with pytest.raises(ValueError, match="aspect"):
        smart_resize(1, 300, 28, 100, 2000)


def _hf_rope_index(ids: np.ndarray, grids: list, image_token: int, merge: int):
    cfg = types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=merge))
    me = types.SimpleNamespace(config=cfg)
    me.get_vision_position_ids = types.MethodType(hf_model.Qwen2VLModel.get_vision_position_ids, me)
    t = torch.as_tensor(ids)[None]
    kinds = (t == image_token).int()
    g = torch.as_tensor(grids, dtype=torch.long) if grids else None
    pos, delta = hf_model.Qwen2VLModel.get_rope_index(me, t, kinds, image_grid_thw=g)
    return pos[:, 0].numpy(), int(delta.reshape(-1)[0])


@pytest.mark.parametrize("grids", [[[1, 4, 6]], [[1, 4, 6], [1, 10, 2]], [[1, 2, 2], [1, 8, 8]]])
def test_mrope_positions_are_get_rope_index(grids):
    merge, pad = 2, 99
    pieces, offsets, at = [np.arange(1, 6)], [], 5
    for i, g in enumerate(grids):
        n = placeholders(g, merge)
        offsets.append(at)
        pieces += [np.full(n, pad), np.arange(10, 13 + i)]
        at += n + 3 + i
    ids = np.concatenate(pieces)
    want, want_delta = _hf_rope_index(ids, grids, pad, merge)
    got, delta = mrope_positions(len(ids), offsets, grids, merge)
    np.testing.assert_array_equal(got, want)
    assert delta == want_delta


def test_text_only_positions_are_sequential():
    got, delta = mrope_positions(7, [], [], 2)
    np.testing.assert_array_equal(got, np.tile(np.arange(7), (3, 1)))
    assert delta == 0


def test_processor_configs_outside_qwen2_vls_are_refused():
    with pytest.raises(ValueError, match="CLIPImageProcessor"):
        QwenImageProcessing.from_json({"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(ValueError, match="min_pixels"):
        QwenImageProcessing.from_json({"min_pixels": 5000, "max_pixels": 100})


QWEN = QwenVisionConfig(kind="qwen2_vl", width=32, intermediate_size=64, depth=2, num_heads=2,
                        out_size=64, patch_size=8, temporal_patch_size=2, merge_size=2,
                        image_token_index=290, processing=QwenImageProcessing(**PROCESSOR))  # fmt: skip


def test_min_and_max_pixels_change_the_run_as_transformers_processor():
    """An image's patches, grid and placeholder run with the bounds overridden equal those of
    transformers' Qwen2VLImageProcessor given the same kwargs; the run differs from the
    checkpoint's bounds'."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (70, 90, 3), dtype=np.uint8))
    ids = [1, 291, 290, 292, 5]
    runs = {}
    for kwargs in ({}, {"max_pixels": 1024}, {"min_pixels": 8192, "max_pixels": 16384}):
        vision = processor_kwargs.apply(QWEN, kwargs)  # (--mm-processor-kwargs)
        got_ids, mm = inputs.from_images(ids, [image], vision)
        want = hf_pil.Qwen2VLImageProcessorPil(**{**PROCESSOR, **kwargs})(
            image, return_tensors="np"
        )
        grid = tuple(want["image_grid_thw"][0].tolist())
        run = int(np.prod(grid)) // 4  # Qwen2VLProcessor's `<|image_pad|>` run
        assert mm.images[0].grid == grid and mm.images[0].length == run
        np.testing.assert_allclose(mm.images[0].pixel_values, want["pixel_values"], atol=2e-6)
        assert got_ids == [1, 291] + [290] * run + [292, 5]
        runs[str(kwargs)] = run
    assert len(set(runs.values())) == 3, runs


def test_one_plain_image_in_two_grids_is_two_images():
    """A plain image 64 x 48 and 48 x 64 px: the same patches in grids (1, 6, 8) and (1, 8, 6),
    so other content hashes (neither the prefix cache nor the encoder cache shares them)."""
    wide, tall = (Image.new("RGB", size, (90, 30, 200)) for size in ((64, 48), (48, 64)))
    _, mm = inputs.from_images([1, 290, 290], [wide, tall], QWEN)
    a, b = mm.images
    assert np.array_equal(a.pixel_values, b.pixel_values) and a.grid != b.grid
    assert a.content_hash != b.content_hash
