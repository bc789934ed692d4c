"""A vision model's images in a step: which image rows the step's tokens hold, the images
encoded for them, and the (rows, features) the model scatters into its input embeddings
(`llama.IMAGE_EMBEDS`).

An image is encoded the first time a step reaches one of its placeholder tokens (the step's new
images in one batch through the tower), and its features are kept on the request until a step
has consumed its last placeholder: a prompt chunked across steps reads the rest of the same
features, a prefix-cache hit that covers an image never encodes it, and a request preempted
before its image was consumed reuses them on recompute (one consumed before is encoded again).
The host plans with one NumPy range per image overlap, never a loop per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.request import Request


@dataclass
class ImagePlan:
    """A step's image rows, built on the host in `prepare`."""

    encode: list[tuple[Request, int]]  # (request, image index) to encode this step
    rows: np.ndarray  # int64 [R]: rows of the step's token batch that are image placeholders
    # (request, image index, first feature row, end) in the order of `rows`
    parts: list[tuple[Request, int, int, int]]


def prepare(reqs: list[Request], starts: np.ndarray, qlens: np.ndarray,
            cu: np.ndarray) -> ImagePlan | None:  # fmt: skip
    """The step's image placeholder rows (None: its tokens hold none). Only the rows before
    their request's last image are looked at (decodes never are)."""
    ends = np.fromiter((r.images_end for r in reqs), dtype=np.int64, count=len(reqs))
    encode, rows, parts = [], [], []
    for i in np.flatnonzero(starts < ends).tolist():
        r, st = reqs[i], int(starts[i])
        end = st + int(qlens[i])
        for j, im in enumerate(r.params.multi_modal.images):
            a, b = max(im.offset, st), min(im.end, end)
            if a >= b:
                continue
            cache = r.image_features
            if cache is None:
                cache = r.image_features = {}
            if j not in cache:
                cache[j] = None  # encoded in `device_step`
                encode.append((r, j))
            rows.append(np.arange(a - st, b - st, dtype=np.int64) + int(cu[i]))
            parts.append((r, j, a - im.offset, b - im.offset))
    if not parts:
        return None
    return ImagePlan(encode, np.concatenate(rows), parts)


def spans(rows: np.ndarray, positions: np.ndarray,
          cu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """`attention.base.IMAGE_SPANS` of a step whose image rows are `rows` (any rank reads them
    from the step): each run of consecutive rows is one image's (Gemma 3's images are apart:
    text tokens frame each), whole in its chunk (the scheduler's rule), so its first and last
    rows' positions bound it; a sequence's first row (`cu`: the step's query starts) starts a
    run. (After a prefix-cache hit inside an image the run starts there:
    the image's earlier keys precede every query of the run and are seen causally.)"""
    start = np.flatnonzero((np.diff(rows, prepend=-2) != 1) | np.isin(rows, cu))
    end = np.append(start[1:], len(rows))
    n = end - start
    lo, hi = positions[rows[start]], positions[rows[end - 1]]
    return rows, np.repeat(lo, n), np.repeat(hi, n)


def device_step(model, plan: ImagePlan, to_device) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode the plan's new images (one batch), then (rows, features) for the model; an image
    whose last placeholder this step reaches is dropped from its request's features."""
    if plan.encode and getattr(model, "ragged_images", False):  # Qwen2-VL's: sizes differ
        ims = [r.params.multi_modal.images[j] for r, j in plan.encode]
        features = model.encode_image_list([to_device(im.pixel_values) for im in ims],
                                           [im.grid for im in ims])  # fmt: skip
        for k, (r, j) in enumerate(plan.encode):
            r.image_features[j] = features[k]
    elif plan.encode:
        pixels = np.stack([r.params.multi_modal.images[j].pixel_values for r, j in plan.encode])
        features = model.encode_images(to_device(pixels))
        for k, (r, j) in enumerate(plan.encode):
            r.image_features[j] = features[k]
    pieces = [r.image_features[j][a:b] for r, j, a, b in plan.parts]
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    for r, j, _, b in plan.parts:
        if b == r.params.multi_modal.images[j].length:  # consumed: the features are let go
            r.image_features.pop(j, None)
    return to_device(plan.rows), out
