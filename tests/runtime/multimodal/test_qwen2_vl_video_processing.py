"""Qwen2-VL's video preprocessing (`multimodal/qwen2_vl_video.py`) against transformers'
pixels (`qwen2_vl_video_testlib.hf_video`: the PIL image processor per frame, the frames of
each temporal patch side by side): resized and unresized frames, an odd count (the last
frame repeated), vLLM's forms of a video, and the refusals of what is not one."""

from __future__ import annotations

import numpy as np
import pytest
from pagoda.runtime.multimodal.qwen2_vl_processing import QwenImageProcessing
from pagoda.runtime.multimodal.qwen2_vl_video import frames_of, preprocess_video
from PIL import Image
from qwen2_vl_testlib import PROCESSOR
from qwen2_vl_video_testlib import frames, hf_video

pytest.importorskip("transformers")
P = QwenImageProcessing.from_json(PROCESSOR)


@pytest.mark.parametrize(
    "count, size", [(4, (16, 32)), (5, (20, 36)), (1, (40, 24)), (8, (70, 90))]
)
def test_patches_and_grid_are_transformers(count, size):
    video = frames(count, count, size)
    ours = preprocess_video(video, P)
    pixels, grid = hf_video(video)
    assert list(ours.grid) == grid and ours.patches.dtype == np.float32
    np.testing.assert_allclose(ours.patches, pixels.numpy(), rtol=0, atol=1e-6)


def test_pil_frames_and_metadata_are_the_arrays():
    video = frames(0, 4, (16, 32))
    base = preprocess_video(video, P)
    pil = preprocess_video([Image.fromarray(f) for f in video], P)
    rated = preprocess_video((video, {"fps": 4.0}), P)
    assert np.array_equal(pil.patches, base.patches) and np.array_equal(rated.patches, base.patches)
    assert (base.seconds_per_grid, rated.seconds_per_grid) == (1.0, 0.5)  # 2 frames at 2 / 4 fps


@pytest.mark.parametrize(
    "video, message",
    [
        (np.zeros((2, 8, 8, 3), np.float32), "must be uint8"),
        (np.zeros((8, 8, 3), np.uint8), r"uint8 array \[frames, height, width, 3\]"),
        (np.zeros((0, 8, 8, 3), np.uint8), "1 to 768 frames"),
        ([], "non-empty list of PIL images"),
        ([Image.new("RGB", (8, 8)), Image.new("RGB", (9, 8))], "share one size"),
        ((np.zeros((2, 8, 8, 3), np.uint8), {"fps": 0}), "fps must be a positive number"),
        ("video.mp4", "uint8 array"),
    ],
)
def test_what_is_not_a_video_is_refused(video, message):
    with pytest.raises(ValueError, match=message):
        frames_of(video)


def test_qwen3_vl_videos_are_refused():
    """Qwen3-VL's processor writes each temporal patch's timestamp into the prompt: refused."""
    from pagoda.runtime.multimodal import inputs
    from pagoda.runtime.multimodal.qwen3_vl_config import read_qwen3_vl

    vision = read_qwen3_vl({}, None)
    assert not inputs.reads_videos(vision)
    with pytest.raises(ValueError, match=r"this model \(qwen3_vl\) reads no videos"):
        inputs.from_data([1, 151656], {"video": frames(0, 2, (16, 16))}, vision)


def test_the_checkpoints_video_processor_is_read(tmp_path):
    """video_preprocessor_config.json's fields (transformers' `size` names) over the image
    processor's; none saved: the image processor's; the encoder cache's largest run covers a
    video's temporal patch; patches unlike the tower's: refused."""
    import json

    from pagoda.runtime.multimodal import qwen2_vl_inputs
    from pagoda.runtime.multimodal.qwen2_vl_config import read_qwen2_vl

    top = {"vision_config": {"patch_size": 8, "embed_dim": 32, "num_heads": 2}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    assert read_qwen2_vl("qwen2_vl", top, tmp_path).video == P
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 8,
             "size": {"shortest_edge": 512, "longest_edge": 4096}}  # fmt: skip
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    vision = read_qwen2_vl("qwen2_vl", top, tmp_path)
    assert (vision.video.min_pixels, vision.video.max_pixels) == (512, 4096)
    assert vision.processing == P
    assert qwen2_vl_inputs.max_run(vision) == 16384 // 16**2  # the image's, the larger
    (tmp_path / "video_preprocessor_config.json").write_text(
        json.dumps({**video, "size": {"shortest_edge": 512, "longest_edge": 32768}})
    )
    assert qwen2_vl_inputs.max_run(read_qwen2_vl("qwen2_vl", top, tmp_path)) == 32768 // 16**2
    (tmp_path / "video_preprocessor_config.json").write_text(
        json.dumps({**video, "patch_size": 14})
    )
    with pytest.raises(ValueError, match="the video processor's patches"):
        read_qwen2_vl("qwen2_vl", top, tmp_path)
