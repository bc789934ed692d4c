"""`multimodal.idefics3_processing` and `idefics3_inputs.image_text` against transformers: the
tiles and grid of `Idefics3ImageProcessor` / `SmolVLMImageProcessor` (their PIL backend) with
and without image splitting, at the tiny test sizes and the published 364 px tiles, on
landscape, portrait, small, RGBA, grey and extreme images; an image's prompt ids are the
tokenized text `Idefics3Processor` writes, which SmolVLM's processor writes too; the image
side of published configs, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from idefics3_testlib import SPECIAL, TILE, image, image_processor, make_processor
from pagoda.runtime.multimodal.idefics3_config import Idefics3VisionConfig, read_idefics3
from pagoda.runtime.multimodal.idefics3_inputs import image_text
from pagoda.runtime.multimodal.idefics3_processing import TileProcessing, preprocess

transformers = pytest.importorskip("transformers")
from transformers.models.smolvlm import processing_smolvlm  # noqa: E402

SIZES = [{}, {"size": {"longest_edge": 728}, "max_image_size": {"longest_edge": 364}}]


def _images() -> list:
    return [image(0, (40, 52)), image(1, (97, 33)), image(2, (20, 25)),
            image(3, (50, 70), "RGBA"), image(4, (61, 45), "L"), image(5, (300, 410)),
            image(6, (1, 500))]  # fmt: skip


@pytest.mark.parametrize("splitting", [True, False])
@pytest.mark.parametrize(("kind", "sizes"), [("idefics3", SIZES[0]), ("smolvlm", SIZES[0]),
                                             ("idefics3", SIZES[1])])  # fmt: skip
def test_tiles_are_the_image_processors(kind, splitting, sizes):
    """(SmolVLM's processor is Idefics3's code: the published tile size once, as Idefics3's.)"""
    hf = image_processor(kind, splitting, **sizes)
    ours = TileProcessing.from_json(hf.to_dict(), TILE)
    assert ours.splitting == splitting and ours.tile == hf.max_image_size["longest_edge"]
    for im in _images():
        want = hf(im, return_tensors="np", return_row_col_info=True)
        tiles, rows, cols = preprocess(im, ours)
        assert (rows, cols) == (want["rows"][0][0], want["cols"][0][0])
        assert tiles.dtype == np.float32 and tiles.shape == want["pixel_values"][0].shape
        assert tiles.shape[0] == (rows * cols + 1 if rows else 1)
        np.testing.assert_allclose(tiles, want["pixel_values"][0], rtol=0, atol=1e-6)
        assert want["pixel_attention_mask"][0].all()  # (every tile is whole: no padding)


def _vision(processor) -> Idefics3VisionConfig:
    tok = processor.tokenizer
    ids = lambda s: tuple(tok.encode(s, add_special_tokens=False))  # noqa: E731
    grid = tuple(tuple(tok.convert_tokens_to_ids(f"<row_{r}_col_{c}>") for c in range(1, 7))
                 for r in range(1, 7))  # fmt: skip
    return Idefics3VisionConfig(
        hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, image_size=TILE,
        patch_size=4, scale_factor=2, image_token_index=tok.convert_tokens_to_ids("<image>"),
        fake_token=tok.convert_tokens_to_ids(SPECIAL[0]),
        global_token=tok.convert_tokens_to_ids("<global-img>"), row_col=grid,
        newline=ids("\n"), newlines2=ids("\n\n"), processing=TileProcessing(tile=TILE),
    )  # fmt: skip


@pytest.mark.parametrize("grid", [(0, 0), (1, 2), (2, 1), (2, 2), (3, 5), (6, 6)])
def test_an_images_ids_are_the_processors_text(grid):
    processor = make_processor("idefics3")
    rows, cols = grid
    text = processor.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
    smol = processing_smolvlm.get_image_prompt_string(rows, cols, 16, SPECIAL[0], "<image>",
                                                      "<global-img>")  # fmt: skip
    assert smol == text
    vision = _vision(processor)
    ids, starts = image_text(rows, cols, vision)
    assert ids == processor.tokenizer.encode(text, add_special_tokens=False)
    assert len(starts) == (rows * cols + 1 if rows else 1)
    for s in starts:
        assert ids[s - 1] in (vision.global_token, *sum(vision.row_col, ()))
        assert ids[s : s + 16] == [vision.image_token_index] * 16
    with pytest.raises(ValueError, match="row_7_col_1"):
        image_text(7, 1, vision)


def _checkpoint(path, top: dict, processor: dict | None) -> None:
    (path / "config.json").write_text(json.dumps(top))
    if processor is not None:
        (path / "preprocessor_config.json").write_text(json.dumps(processor))
    make_processor("idefics3").tokenizer.save_pretrained(path)


def test_published_configs_read(tmp_path):
    """SmolVLM-256M-Instruct's image side (512 px tiles of 16 px patches, scale 4: 64 rows a
    tile, 2048 px longest edge) and Idefics3-8B-Llama3's (364 px, 14 px, scale 2: 169)."""
    smol = {"architectures": ["SmolVLMForConditionalGeneration"], "model_type": "smolvlm",
            "image_token_id": 49190, "scale_factor": 4,
            "vision_config": {"hidden_size": 768, "image_size": 512, "patch_size": 16,
                              "model_type": "smolvlm_vision", "num_attention_heads": 12,
                              "intermediate_size": 3072, "num_hidden_layers": 12}}  # fmt: skip
    proc = {"image_processor_type": "SmolVLMImageProcessor", "do_image_splitting": True,
            "max_image_size": {"longest_edge": 512}, "size": {"longest_edge": 2048},
            "resample": 1, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}  # fmt: skip
    _checkpoint(tmp_path, smol, proc)
    v = read_idefics3(smol, tmp_path)
    assert (v.tokens_per_image, v.processing.longest_edge, v.image_token_index) == (64, 2048, 49190)
    assert len(v.row_col) == 4 and v.newlines2 == (256,)  # (2048 / 512 rows; "\n\n" one token)
    idefics = {"architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3",
               "vision_config": {"hidden_size": 1152, "image_size": 364, "patch_size": 14,
                                 "model_type": "idefics3_vision"}}  # fmt: skip
    _checkpoint(tmp_path, idefics, {"image_processor_type": "Idefics3ImageProcessor",
                                    "max_image_size": {"longest_edge": 364}})  # fmt: skip
    v = read_idefics3(idefics, tmp_path)
    assert (v.tokens_per_image, v.num_heads, v.scale_factor, v.image_token_index) == (
        169, 16, 2, 128_257)  # fmt: skip


def test_what_is_not_idefics3s_is_refused(tmp_path):
    top = {"vision_config": {"image_size": 32, "patch_size": 4}}
    _checkpoint(tmp_path, top, {"image_processor_type": "CLIPImageProcessor"})
    with pytest.raises(ValueError, match="CLIPImageProcessor"):
        read_idefics3(top, tmp_path)
    _checkpoint(tmp_path, top, {"size": {"height": 32, "width": 32}})
    with pytest.raises(ValueError, match="longest_edge"):
        read_idefics3(top, tmp_path)
    _checkpoint(tmp_path, top, {"max_image_size": {"longest_edge": 64}})
    with pytest.raises(ValueError, match="max_image_size 64"):
        read_idefics3(top, tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 9}))
    _checkpoint(tmp_path, top, {"max_image_size": {"longest_edge": 32}})
    with pytest.raises(ValueError, match="image_seq_len 9"):
        read_idefics3(top, tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "processor_config.json").unlink()
    assert read_idefics3(top, tmp_path) is None  # (text only: no image tokens to write)
