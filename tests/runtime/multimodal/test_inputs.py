"""`multimodal.inputs` (placeholder expansion, the engine's checks) and `multimodal.hashing`
(the prefix cache's per-block image keys)."""

from __future__ import annotations

import numpy as np
import pytest
from pagoda.runtime.multimodal import inputs
from pagoda.runtime.multimodal.config import ImageProcessing, VisionConfig
from pagoda.runtime.multimodal.hashing import block_extra

TOKEN = 7
VISION = VisionConfig(32, 64, 2, 4, image_size=30, patch_size=10, image_token_index=TOKEN,
                      processing=ImageProcessing(shortest_edge=30, crop=(30, 30)))  # fmt: skip


def _pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 30, 30)).astype(np.float32)


def test_each_image_token_becomes_the_images_run():
    ids, mm = inputs.build([1, TOKEN, 2, 3, TOKEN, 4], [_pixels(0), _pixels(1)], VISION)
    assert ids == [1] + [TOKEN] * 9 + [2, 3] + [TOKEN] * 9 + [4]
    assert [(im.offset, im.length) for im in mm.images] == [(1, 9), (12, 9)]
    assert mm.images[0].content_hash != mm.images[1].content_hash
    assert mm.images[0].content_hash == inputs.pixels_hash(_pixels(0))
    inputs.check(ids, mm, VISION, limit=2)  # what `build` makes passes the engine's checks


def test_mismatches_are_refused():
    with pytest.raises(ValueError, match="1 image token"):
        inputs.build([1, TOKEN], [], VISION)
    ids, mm = inputs.build([1, TOKEN, 2], [_pixels(0)], VISION)
    with pytest.raises(ValueError, match="at most 0"):
        inputs.check(ids, mm, VISION, limit=0)
    with pytest.raises(ValueError, match="does not read images"):
        inputs.check(ids, mm, None, limit=1)
    with pytest.raises(ValueError, match="placeholder tokens"):
        inputs.check([*ids[:5], 3, *ids[6:]], mm, VISION, limit=1)
    small = inputs.MultiModalInputs(
        (inputs.ImageInput(np.zeros((3, 20, 20), np.float32), 1, 9, b""),)
    )
    with pytest.raises(ValueError, match="float32"):
        inputs.check(ids, small, VISION, limit=1)
    with pytest.raises(ValueError, match=r"'video': video or list of videos\}; got \['audio'\]"):
        inputs.from_data(ids, {"audio": 1}, VISION)
    with pytest.raises(ValueError, match=r"this model \(llava\) reads no videos"):
        inputs.from_data(ids, {"video": np.zeros((2, 8, 8, 3), np.uint8)}, VISION)


def test_block_keys_name_the_images_a_block_holds():
    _, mm = inputs.build([1, 2, 3, TOKEN, 4], [_pixels(0)], VISION)  # image at [3, 12)
    assert block_extra(mm, 0, 3) == b""
    assert block_extra(mm, 0, 4) == block_extra(mm, 8, 16) != b""
    assert block_extra(mm, 12, 16) == b""
    _, other = inputs.build([1, 2, 3, TOKEN, 4], [_pixels(1)], VISION)
    assert block_extra(other, 0, 4) != block_extra(mm, 0, 4)
