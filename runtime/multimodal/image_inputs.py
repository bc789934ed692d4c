"""The engine's image inputs as plain data (pickled to the engine process): each image's
pixels (a Qwen2-VL image's: patches and grid; a LLaVA-NeXT image's: crops and size; an Idefics3 image's: one per tile), where its
placeholder tokens sit in the prompt, and a content hash; a prompt's images and, for Qwen2-VL,
its M-RoPE positions. Apart from `inputs.py` so each family's input builder
(`qwen2_vl_inputs.py`) imports them without a cycle; `repeat_runs` expands a prompt's image
tokens to runs of their own lengths (the families whose runs vary per image)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


class RunsNeedImages(ValueError):
    """A family's `expand`: its placeholder runs depend on each image (its size), so they are
    counted where the images are read (`/tokenize` then reads them: `server/chat_images.py`)."""


@dataclass(frozen=True, eq=False)
class ImageInput:
    pixel_values: np.ndarray  # float32 [3, H, W], preprocessed
    offset: int  # the prompt position of its first placeholder token
    length: int  # its placeholder tokens (the rows of its features)
    content_hash: bytes  # 16 bytes of the pixels (the prefix cache keys blocks by it)
    # Qwen2-VL's patch grid (t, h, w), pixels its patches; LLaVA-NeXT's / OneVision's image
    # (height, width), pixels its crops [1 + crops, 3, S, S]; None: one [3, H, W] image
    grid: tuple[int, ...] | None = None
    # one temporal patch of a video (Qwen2-VL's: its `<|video_pad|>` run, grid (1, h, w)), not
    # an image: a video is the consecutive temporal patches its run holds
    video: bool = False

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, eq=False)
class MultiModalInputs:
    """The images of one prompt, in prompt order (`SamplingParams.multi_modal`)."""

    images: tuple[ImageInput, ...]
    # Qwen2-VL's M-RoPE: the prompt's int64 [3, L] positions and its decode delta
    # (`qwen2_vl_inputs.build`); None and 0 elsewhere
    mrope: np.ndarray | None = None
    mrope_delta: int = 0
    # each image's tokens attend to each other both ways (Gemma 3's): a prefill chunk never
    # ends inside an image (`inputs.whole_images`)
    bidirectional: bool = False
    # an image of several tiles (Idefics3's: `idefics3_inputs.py`), each tile an `ImageInput`:
    # each image's count of them, in order; () where each image is one
    tiles: tuple[int, ...] = ()
    num_videos: int = 0  # the prompt's videos (their temporal patches are `images` too)

    @property
    def num_images(self) -> int:
        """The prompt's images (what `--limit-mm-per-prompt` counts), not their tiles."""
        return len(self.tiles) if self.tiles else sum(not im.video for im in self.images)


def pixels_hash(pixels: np.ndarray, grid: tuple[int, ...] | None = None) -> bytes:
    """128-bit hash of preprocessed pixels (their shape and bytes) and Qwen2-VL's patch grid
    (the same patches in a 4 x 6 or a 6 x 4 grid, a plain image's, are other images)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(pixels.shape).encode())
    if grid is not None:
        h.update(repr(tuple(grid)).encode())
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.digest()


def repeat_runs(token_ids, token: int, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The prompt with its k-th `token` repeated `lengths[k]` times, and each run's first
    position; ValueError where the prompt holds another number of `token`s."""
    ids = np.asarray(token_ids, dtype=np.int64)
    at = np.flatnonzero(ids == token)
    if len(at) != len(lengths):
        raise ValueError(f"the prompt has {len(at)} image token(s) (id {token}) for "
                         f"{len(lengths)} image(s): put one image token where each image goes")  # fmt: skip
    return repeat_at(ids, at, lengths)


def repeat_at(ids: np.ndarray, at: np.ndarray, lengths) -> tuple[np.ndarray, np.ndarray]:
    """`ids` with the token at each position `at[k]` (ascending) repeated `lengths[k]` times,
    and each run's first position."""
    n = np.asarray(lengths, dtype=np.int64)
    repeats = np.ones(len(ids), dtype=np.int64)
    repeats[at] = n
    offsets = at + np.concatenate([[0], np.cumsum(n - 1)[:-1]]).astype(np.int64)
    return np.repeat(ids, repeats), offsets


def check_tiles(token_ids, mm: MultiModalInputs, vision) -> None:
    """ValueError unless each tile of `mm` (the families whose images are tiles, each an
    `ImageInput`: Idefics3's, InternVL's) is float32 [3, S, S] of `vision.image_size` over a
    run of `vision.tokens_per_image` image tokens, and the tiles add up to the images'."""
    if sum(mm.tiles) != len(mm.images) or min(mm.tiles, default=1) < 1:
        raise ValueError(f"multi_modal: tiles per image {mm.tiles} do not add up to its "
                         f"{len(mm.images)} tiles")  # fmt: skip
    ids = np.asarray(token_ids, dtype=np.int64)
    shape, n = (3, vision.image_size, vision.image_size), vision.tokens_per_image
    for i, im in enumerate(mm.images):
        if tuple(im.pixel_values.shape) != shape or im.pixel_values.dtype != np.float32:
            raise ValueError(f"tile {i}: pixels must be float32 {shape}, got "
                             f"{im.pixel_values.dtype} {tuple(im.pixel_values.shape)}")  # fmt: skip
        run = ids[im.offset : im.end]
        if im.length != n or len(run) != n or (run != vision.image_token_index).any():
            raise ValueError(f"tile {i}: its {n} placeholder tokens are not at prompt positions "
                             f"[{im.offset}, {im.end})")  # fmt: skip
