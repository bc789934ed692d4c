"""CLIPImageProcessor's preprocessing with PIL and NumPy (the API process has no torch): an
image → float32 [3, H, W] pixels, equal to transformers' `CLIPImageProcessor` output.

The steps as transformers' PIL backend runs them: RGB (transparency composited over white),
the shortest edge resized to `shortest_edge` (the long one to int(size * long / short)) with
PIL's filter on the uint8 image, a center crop (zero-padded where the image is smaller), then
x * rescale_factor in float64 cast to float32, then (x - mean) / std in float32.
"""

from __future__ import annotations

import numpy as np
from pagoda.runtime.multimodal.config import ImageProcessing
from PIL import Image

# decompression bombs: PIL's own check raises past twice this many pixels
MAX_IMAGE_PIXELS = 64_000_000


def as_rgb(image: Image.Image) -> Image.Image:
    """The image in RGB; a transparent one composited over white (transformers' way)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def resized_shape(height: int, width: int, shortest: int) -> tuple[int, int]:
    """(height, width) with the shortest edge `shortest`, the other scaled (truncated)."""
    if width <= height:
        return int(shortest * height / width), shortest
    return shortest, int(shortest * width / height)


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """[C, height, width] from the middle of `pixels` [C, H, W]; zero-padded (centred) where
    it is smaller than the crop."""
    _, h, w = pixels.shape
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top : top + height, left : left + width]
    out = np.zeros((pixels.shape[0], max(h, height), max(w, width)), dtype=pixels.dtype)
    pt, pl = -(-(out.shape[1] - h) // 2), -(-(out.shape[2] - w) // 2)
    out[:, pt : pt + h, pl : pl + w] = pixels
    return center_crop(out, height, width)


def checked(image: object, convert_rgb: bool) -> Image.Image:
    """`image` if it is a PIL image within MAX_IMAGE_PIXELS (in RGB where `convert_rgb`);
    ValueError, one line, otherwise."""
    if not isinstance(image, Image.Image):
        raise ValueError(f"an image must be a PIL.Image.Image, got {type(image).__name__}")
    if image.width * image.height > MAX_IMAGE_PIXELS:
        raise ValueError(f"image of {image.width}x{image.height} pixels is larger than "
                         f"{MAX_IMAGE_PIXELS} pixels")  # fmt: skip
    return as_rgb(image) if convert_rgb else image


def rescale_normalize(pixels: np.ndarray, p) -> np.ndarray:
    """uint8 [C, H, W] → float32: x * rescale_factor in float64 cast to float32, then
    (x - mean) / std in float32, as `p`'s do_rescale / do_normalize say (CLIP's and Qwen2-VL's
    processors alike)."""
    if p.do_rescale:
        pixels = (pixels.astype(np.float64) * p.rescale_factor).astype(np.float32)
    else:
        pixels = pixels.astype(np.float32)
    if p.do_normalize:
        mean = np.asarray(p.mean, dtype=np.float32)[:, None, None]
        std = np.asarray(p.std, dtype=np.float32)[:, None, None]
        pixels = (pixels - mean) / std
    return pixels


def sized_pixels(image: object, p, size, multiple: int) -> np.ndarray:
    """`image` (checked) resized to `size(height, width)` where `p.do_resize` (PIL's filter on
    the uint8 image), rescaled and normalized: float32 [3, H, W], H and W multiples of
    `multiple` (Qwen2-VL's and Pixtral's processors; ValueError, one line, otherwise)."""
    image = checked(image, p.do_convert_rgb)
    if p.do_resize:
        h, w = size(image.height, image.width)
        image = image.resize((w, h), resample=p.resample)
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    pixels = np.moveaxis(pixels, -1, 0)
    if pixels.shape[0] != 3:
        raise ValueError(f"an image must have 3 channels, got {pixels.shape[0]}")
    if pixels.shape[1] % multiple or pixels.shape[2] % multiple:
        raise ValueError(f"an image of {pixels.shape[2]}x{pixels.shape[1]} pixels is not a "
                         f"multiple of {multiple} (do_resize is off)")  # fmt: skip
    return rescale_normalize(pixels, p)


def stacked_tiles(frames: list[np.ndarray], p) -> np.ndarray:
    """Tiles cut from an image, uint8 [S, S, C] or [S, S] each → float32 [T, 3, S, S]
    (C-contiguous), rescaled and normalized as `p` says (`rescale_normalize`); ValueError for
    an image of another number of channels (the tiling families': Idefics3's, InternVL's)."""
    pixels = np.stack([f if f.ndim == 3 else f[:, :, None] for f in frames])
    pixels = np.moveaxis(pixels, -1, 1)  # [T, C, S, S]
    if pixels.shape[1] != 3:
        raise ValueError(
            f"an image must have 3 channels after preprocessing, got {pixels.shape[1]}"
        )
    return np.ascontiguousarray(rescale_normalize(pixels, p), dtype=np.float32)


def preprocess(image: Image.Image, p: ImageProcessing) -> np.ndarray:
    """One image → float32 [3, H, W] (C-contiguous), as `CLIPImageProcessor` computes it."""
    image = checked(image, p.do_convert_rgb)
    if p.do_resize:
        h, w = p.crop if p.exact_resize else resized_shape(image.height, image.width,
                                                             p.shortest_edge)  # fmt: skip
        image = image.resize((w, h), resample=p.resample)
    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    pixels = np.moveaxis(pixels, -1, 0)  # [C, H, W]
    if p.do_center_crop and not p.exact_resize:
        pixels = center_crop(pixels, *p.crop)
    pixels = rescale_normalize(pixels, p)
    if pixels.shape[0] != 3:
        raise ValueError(
            f"an image must have 3 channels after preprocessing, got {pixels.shape[0]}"
        )
    return np.ascontiguousarray(pixels, dtype=np.float32)
