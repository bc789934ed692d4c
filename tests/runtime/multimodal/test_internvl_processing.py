"""`multimodal.internvl_processing` and `internvl_config` against transformers: the tiles of
`GotOcr2ImageProcessor` (its PIL backend) as `InternVLProcessor` calls it (crop_to_patches on),
with other min/max_patches and without tiling, at the tiny test size and the published 448 px
tiles, on landscape, portrait, small, RGBA, grey and extreme images; the tile counts of
`get_number_of_image_patches`; the image side of published configs, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from internvl_testlib import CONTEXT, END, START, TILE, image, image_processor, make_processor
from pagoda.runtime.multimodal.internvl_config import read_internvl
from pagoda.runtime.multimodal.internvl_processing import TileProcessing, num_tiles, preprocess

pytest.importorskip("transformers")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
KWARGS = [{"crop_to_patches": True}, {"crop_to_patches": True, "min_patches": 2, "max_patches": 6},
          {"crop_to_patches": True, "max_patches": 1}, {"crop_to_patches": False}]  # fmt: skip


def _images() -> list:
    return [image(0, (40, 52)), image(1, (97, 33)), image(2, (20, 25)),
            image(3, (50, 70), "RGBA"), image(4, (61, 45), "L"), image(5, (150, 205)),
            image(6, (1, 300)), image(7, (64, 64))]  # fmt: skip


def _ours(tile: int, **kw) -> TileProcessing:
    kw = {"max_patches": 4, **kw}
    return TileProcessing(tile=tile, mean=MEAN, std=STD, **kw)


@pytest.mark.parametrize("kw", KWARGS)
def test_tiles_are_the_image_processors(kw):
    theirs, ours = image_processor(**kw), _ours(TILE, **kw)
    for im in _images():
        want = theirs(im, return_tensors="np")["pixel_values"]
        got = preprocess(im, ours)
        assert got.shape == want.shape and got.dtype == np.float32
        assert got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_published_tiles_are_the_image_processors():
    """InternVL3's processor: 448 px tiles, 1 to 12 of them and the thumbnail."""
    kw = {"size": {"height": 448, "width": 448}, "max_patches": 12, "crop_to_patches": True}
    theirs, ours = image_processor(**kw), _ours(448, max_patches=12)
    for im in (image(8, (300, 1000)),):  # (3 x 1 tiles and the thumbnail)
        want = theirs(im, return_tensors="np")["pixel_values"]
        np.testing.assert_allclose(preprocess(im, ours), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bounds", [(1, 4), (1, 12), (2, 6), (3, 3), (1, 1)])
def test_tile_counts_are_get_number_of_image_patches(bounds):
    low, high = bounds
    theirs = image_processor(crop_to_patches=True, min_patches=low, max_patches=high)
    ours = _ours(TILE, min_patches=low, max_patches=high)
    kw = {"crop_to_patches": True, "min_patches": low, "max_patches": high}
    for h in (1, 7, 16, 31, 32, 33, 48, 64, 90, 200):
        for w in (1, 9, 16, 32, 40, 64, 65, 100, 333):
            assert num_tiles(h, w, ours) == theirs.get_number_of_image_patches(h, w, kw), (h, w)


def _checkpoint(path, top: dict, processor: dict | None) -> None:
    (path / "config.json").write_text(json.dumps(top))
    if processor is not None:
        (path / "preprocessor_config.json").write_text(json.dumps(processor))
    make_processor().tokenizer.save_pretrained(path)


PROCESSOR = {"image_processor_type": "GotOcr2ImageProcessorFast", "crop_to_patches": False,
             "size": {"height": 448, "width": 448}, "max_patches": 12, "min_patches": 1,
             "image_mean": list(MEAN), "image_std": list(STD), "resample": 3}  # fmt: skip


def test_published_configs_read(tmp_path):
    """InternVL3-1B-hf's image side (InternViT-300M: 448 px tiles of 14 px patches, LayerNorm,
    256 rows a tile) and InternViT-6B's options (RMSNorm, q/k norms); the processor tiles
    (InternVLProcessor's crop_to_patches, whatever its own config says)."""
    top = {"architectures": ["InternVLForConditionalGeneration"], "model_type": "internvl",
           "image_token_id": CONTEXT, "image_seq_length": 256, "downsample_ratio": 0.5,
           "vision_config": {"hidden_size": 1024, "image_size": [448, 448],
                             "patch_size": [14, 14], "model_type": "internvl_vision",
                             "num_attention_heads": 16, "intermediate_size": 4096,
                             "num_hidden_layers": 24, "norm_type": "layer_norm"}}  # fmt: skip
    _checkpoint(tmp_path, top, PROCESSOR)
    v = read_internvl(top, tmp_path)
    assert (v.tokens_per_image, v.image_size, v.start_token, v.end_token) == (256, 448, START, END)
    assert v.processing.tiling and v.processing.most_tiles == 13 and not v.rms_norm
    big = {**top, "vision_config": {**top["vision_config"], "hidden_size": 3200,
                                    "num_attention_heads": 25, "norm_type": "rms_norm",
                                    "use_qk_norm": True}}  # fmt: skip
    v = read_internvl(big, tmp_path)
    assert v.rms_norm and v.qk_norm and v.num_heads == 25


@pytest.mark.parametrize(("change", "match"), [
    ({"downsample_ratio": 0.25}, "downsample_ratio 0.25"),
    ({"vision_feature_layer": -2}, "vision_feature_layer -2"),
    ({"image_seq_length": 64}, "image_seq_length 64"),
    ({"image_token_id": 5}, "image_token_id 5"),
    ({"vision_config": {"model_type": "siglip_vision_model"}}, "siglip_vision_model"),
    ({"vision_config": {"image_size": [32, 48]}}, "not square"),
    ({"vision_config": {"hidden_act": "relu"}}, "hidden_act 'relu'"),
])  # fmt: skip
def test_what_is_not_internvls_is_refused(tmp_path, change, match):
    top = {"image_token_id": CONTEXT, "image_seq_length": 16,
           "vision_config": {"image_size": 32, "patch_size": 4}}  # fmt: skip
    top = {
        **top,
        **change,
        "vision_config": {**top["vision_config"], **change.get("vision_config", {})},
    }
    _checkpoint(tmp_path, top, {"size": {"height": 32, "width": 32}})
    with pytest.raises(ValueError, match=match):
        read_internvl(top, tmp_path)


def test_another_processor_is_refused_and_no_tokens_read_text_only(tmp_path):
    top = {"image_token_id": CONTEXT, "vision_config": {"image_size": 32, "patch_size": 4}}
    _checkpoint(tmp_path, top, {"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(ValueError, match="CLIPImageProcessor"):
        read_internvl(top, tmp_path)
    _checkpoint(tmp_path, top, {"size": {"height": 64, "width": 64}})
    with pytest.raises(ValueError, match="tower's 32 x 32"):
        read_internvl(top, tmp_path)
    _checkpoint(tmp_path, top, {"min_patches": 5, "max_patches": 4})
    with pytest.raises(ValueError, match="min_patches 5"):
        read_internvl(top, tmp_path)
    _checkpoint(tmp_path, top, {"size": {"height": 32, "width": 32}})
    (tmp_path / "tokenizer.json").unlink()
    assert read_internvl(top, tmp_path) is None  # (text only: no image tokens to write)
