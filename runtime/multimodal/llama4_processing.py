"""Llama 4's image preprocessing with PIL and NumPy (the API process has no torch): an image →
its tiles, float32 [tiles, 3, S, S], and the grid they were cut from, equal to transformers'
`Llama4ImageProcessor` (its torchvision backend, on the CPU).

The steps as transformers runs them: RGB (transparency over white); the canvas of tiles of
S x S (`size`, 336) that best fits the image among every grid of at most `max_patches` tiles
(`best_fit`: the least upscale, else the least downscale, then the least area); the image
resized into that canvas without distortion (no upscale past S on an edge unless
`resize_to_max_canvas`), padded with black at the right and bottom, then cut into rows x cols
tiles in row order; with more than one tile, the whole image resized to S x S after them as
the global tile. Each resize is torch's antialiased bilinear resize of the uint8 image, which
torchvision runs (`resize_uint8`: its fixed-point weights, rows then columns); the rescale
and normalisation run in bfloat16 as transformers' does (`to_bf16` after each step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pagoda.runtime.multimodal.config import _triple, processor_kind
from pagoda.runtime.multimodal.image_processing import checked

PROCESSORS = ("Llama4ImageProcessor", "Llama4ImageProcessorFast", "Llama4ImageProcessorPil")
HALF = (0.5, 0.5, 0.5)
BILINEAR = 2  # PIL.Image.BILINEAR: the resample Llama 4's processor runs


@dataclass(frozen=True)
class Llama4Processing:
    tile: int = 336  # `size`: {"height": S, "width": S}
    max_patches: int = 16  # the most tiles of the canvas (the global tile apart)
    resize_to_max_canvas: bool = False
    rescale_factor: float = 1 / 255
    mean: tuple[float, float, float] = HALF
    std: tuple[float, float, float] = HALF
    do_convert_rgb: bool = True

    def __post_init__(self) -> None:
        if self.tile < 1 or self.max_patches < 1:
            raise ValueError(f"the tile size {self.tile} and max_patches {self.max_patches} "
                             "must be positive")  # fmt: skip

    @classmethod
    def from_json(cls, cfg: dict[str, Any], tile: int) -> Llama4Processing:
        """The processor's fields (`preprocessor_config.json`; `{}`: the defaults at the
        tower's tile size `tile`); ValueError, one line, for what transformers' does not run
        or this one does not."""
        processor_kind(cfg, PROCESSORS)
        size = cfg.get("size", {"height": tile, "width": tile})
        if not isinstance(size, dict) or set(size) != {"height", "width"} or \
                size["height"] != size["width"]:  # fmt: skip
            raise ValueError(f"preprocessor_config.json: size {size} is not a square "
                             "{'height': S, 'width': S}")  # fmt: skip
        for key, want in (("resample", BILINEAR), ("do_resize", True), ("do_rescale", True),
                          ("do_normalize", True)):  # fmt: skip
            if cfg.get(key, want) != want:
                raise ValueError(f"preprocessor_config.json: {key} {cfg[key]!r} is not "
                                 f"supported (Llama 4's processor runs {want!r})")  # fmt: skip
        return cls(
            tile=int(size["height"]),
            max_patches=int(cfg.get("max_patches", 16)),
            resize_to_max_canvas=bool(cfg.get("resize_to_max_canvas", False)),
            rescale_factor=float(cfg.get("rescale_factor", 1 / 255)),
            mean=_triple(cfg.get("image_mean", HALF), "image_mean"),
            std=_triple(cfg.get("image_std", HALF), "image_std"),
            do_convert_rgb=bool(cfg.get("do_convert_rgb", True)),
        )


def canvases(max_patches: int) -> list[tuple[int, int]]:
    """Every grid (rows, cols) of at most `max_patches` tiles, in transformers' order
    (`find_supported_resolutions`: by aspect ratio as first met from the most tiles down)."""
    by_ratio: dict[float, list[tuple[int, int]]] = {}
    for n in range(max_patches, 0, -1):
        for rows in sorted(d for d in range(1, n + 1) if n % d == 0):
            by_ratio.setdefault(rows / (n // rows), []).append((rows, n // rows))
    return [g for grids in by_ratio.values() for g in grids]


def best_fit(height: int, width: int, p: Llama4Processing) -> tuple[int, int]:
    """The grid (rows, cols) whose canvas fits the image best (`get_best_fit`)."""
    grids = np.asarray(canvases(p.max_patches), dtype=np.int64)
    # (transformers divides int64 tensors: float32 scales)
    sh = (grids[:, 0] * p.tile).astype(np.float32) / np.float32(height)
    sw = (grids[:, 1] * p.tile).astype(np.float32) / np.float32(width)
    scales = np.where(sh > sw, sw, sh)
    up = scales[scales >= 1]
    if len(up):
        chosen = up.max() if p.resize_to_max_canvas else up.min()
    else:
        chosen = scales[scales < 1].max()
    picked = grids[scales == chosen]
    return tuple(int(x) for x in picked[np.argmin(picked[:, 0] * picked[:, 1])])  # type: ignore[return-value]


def fitted_size(height: int, width: int, target: tuple[int, int],
                p: Llama4Processing) -> tuple[int, int]:  # fmt: skip
    """The image's size resized into the canvas `target` (pixels) without distortion, no edge
    upscaled past the tile unless `resize_to_max_canvas` (`get_max_res_without_distortion`).
    Where transformers' bound is the canvas's (a 0-d int64 tensor) its scale is float32, where
    it is the tile's or the image's own (a Python int) float64: computed here the same way."""
    bounds = []
    for edge, canvas in ((height, target[0]), (width, target[1])):
        cap = canvas if p.resize_to_max_canvas else min(max(edge, p.tile), canvas)
        from_canvas = p.resize_to_max_canvas or canvas < max(edge, p.tile)
        bounds.append((cap, np.float32 if from_canvas else float))
    (th, fh), (tw, fw) = bounds
    scale_h, scale_w = fh(th) / fh(height), fw(tw) / fw(width)
    wider = (np.float32(scale_w) < np.float32(scale_h) if np.float32 in (fh, fw)
             else scale_w < scale_h)  # fmt: skip
    if wider:
        return max(min(int(np.floor(fw(height) * fw(scale_w))), th), 1), max(tw, 1)
    return max(th, 1), max(min(int(np.floor(fh(width) * fh(scale_h))), tw), 1)


def _weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """torch's antialiased bilinear weights from `n_in` to `n_out` pixels as its uint8 kernel
    holds them: each output's input indices [n_out, K], int16-ranged weights and their bits."""
    scale = n_in / n_out
    support, inv = (scale, 1.0 / scale) if scale >= 1.0 else (1.0, 1.0)
    center = scale * (np.arange(n_out) + 0.5)
    lo = np.maximum((center - support + 0.5).astype(np.int64), 0)
    size = np.minimum((center + support + 0.5).astype(np.int64), n_in) - lo
    j = np.arange(int(size.max()))
    x = np.abs((j[None, :] + lo[:, None] - center[:, None] + 0.5) * inv)
    w = np.where((x < 1.0) & (j[None, :] < size[:, None]), 1.0 - x, 0.0)
    total = w.sum(1, keepdims=True)
    w = w / np.where(total == 0, 1.0, total)
    bits = 0
    while bits < 22 and int(0.5 + w.max() * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    v = w * (1 << bits)
    return np.minimum(lo[:, None] + j, n_in - 1), np.trunc(v + np.where(v < 0, -0.5, 0.5)), bits


def _resample(a: np.ndarray, n_out: int, axis: int) -> np.ndarray:
    """`a` resized to `n_out` along `axis` (0 or 1 of [H, W, C]): the kernel's taps summed in
    int32 as torch's are, one pass per tap over the whole image."""
    if a.shape[axis] == n_out:
        return a
    idx, w, bits = _weights(a.shape[axis], n_out)
    x = np.ascontiguousarray(np.moveaxis(a, axis, 0), dtype=np.int32)  # (rows gathered whole)
    acc = np.full((n_out, *x.shape[1:]), 1 << (bits - 1), dtype=np.int32)
    w = w.astype(np.int32).reshape(*w.shape, *([1] * (x.ndim - 1)))
    for k in range(idx.shape[1]):
        tap = np.take(x, idx[:, k], axis=0)
        tap *= w[:, k]
        acc += tap
    return np.ascontiguousarray(np.moveaxis(np.clip(acc >> bits, 0, 255).astype(np.uint8), 0, axis))


def resize_uint8(a: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, C] → [height, width, C] as torch's antialiased bilinear interpolate of a
    uint8 image (what torchvision's resize runs): the rows' pass, then the columns'."""
    return _resample(_resample(a, width, 1), height, 0)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → the nearest bfloat16 (ties to even), held in float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def _normalize(a: np.ndarray, p: Llama4Processing) -> np.ndarray:
    """uint8 [..., H, W, C] → float32 [..., C, H, W] of bfloat16 values: (x * rescale_factor
    - mean) / std, each step rounded to bfloat16 (transformers' `rescale_and_normalize`)."""
    x = to_bf16(a.astype(np.float32) * np.float32(p.rescale_factor))
    mean = to_bf16(np.asarray(p.mean, dtype=np.float32))
    std = to_bf16(np.asarray(p.std, dtype=np.float32))
    x = to_bf16(to_bf16(x - mean) / std)
    return np.moveaxis(x, -1, -3)


def preprocess(image: object, p: Llama4Processing) -> tuple[np.ndarray, int, int]:
    """One image → (tiles float32 [T, 3, S, S] C-contiguous, rows, cols): T = rows x cols,
    plus the global tile after them where that is more than one."""
    im = np.asarray(checked(image, p.do_convert_rgb))
    if im.ndim == 2:
        im = im[:, :, None]
    if im.shape[2] != 3:
        raise ValueError(f"an image must have 3 channels after preprocessing, got {im.shape[2]}")
    h, w = im.shape[:2]
    rows, cols = best_fit(h, w, p)
    s = p.tile
    fit = resize_uint8(im, *fitted_size(h, w, (rows * s, cols * s), p))
    canvas = np.zeros((rows * s, cols * s, 3), dtype=np.uint8)
    canvas[: fit.shape[0], : fit.shape[1]] = fit
    tiles = canvas.reshape(rows, s, cols, s, 3).transpose(0, 2, 1, 3, 4).reshape(-1, s, s, 3)
    if rows * cols > 1:
        tiles = np.concatenate([tiles, resize_uint8(im, s, s)[None]])
    return np.ascontiguousarray(_normalize(tiles, p), dtype=np.float32), rows, cols
