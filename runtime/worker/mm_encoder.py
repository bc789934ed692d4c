"""A vision model's images in a step: which image rows the step's tokens hold, the images
encoded for them, and the (rows, features) the model scatters into its input embeddings
(`llama.IMAGE_EMBEDS`).

An image is encoded the first time a step reaches one of its placeholder tokens and the shared
encoder cache (`encoder_cache.py`, by content hash) does not hold it: the step's new images in
one batch through the tower, each once however many of the step's requests hold it. A request
keeps its image's cache entry until a step has consumed its last placeholder: a prompt chunked
across steps reads the rest of the same features, a prefix-cache hit that covers an image never
looks it up, and a request preempted before its image was consumed reuses them on recompute
(one consumed before looks it up again). The host plans with one NumPy range per image
overlap, never a loop per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pagoda.runtime.multimodal.image_inputs import ImageInput
from pagoda.runtime.request import Request
from pagoda.runtime.worker.encoder_cache import EncoderCache, Entry


@dataclass
class ImagePlan:
    """A step's image rows, built on the host in `prepare`."""

    encode: list[tuple[Entry, ImageInput]]  # the cache entries to encode this step, and whose
    rows: np.ndarray  # int64 [R]: rows of the step's token batch that are image placeholders
    # (request, image index, its entry, first feature row, end) in the order of `rows`
    parts: list[tuple[Request, int, Entry, int, int]]
    cache: EncoderCache | None = None  # (rank 0's; the other ranks' plans carry rows only)


def prepare(cache: EncoderCache, reqs: list[Request], starts: np.ndarray, qlens: np.ndarray,
            cu: np.ndarray) -> ImagePlan | None:  # fmt: skip
    """The step's image placeholder rows (None: its tokens hold none), each image a request
    reaches for the first time looked up in `cache`. Only the rows before their request's last
    image are looked at (decodes never are)."""
    ends = np.fromiter((r.images_end for r in reqs), dtype=np.int64, count=len(reqs))
    encode, rows, parts = [], [], []
    for i in np.flatnonzero(starts < ends).tolist():
        r, st = reqs[i], int(starts[i])
        end = st + int(qlens[i])
        for j, im in enumerate(r.params.multi_modal.images):
            a, b = max(im.offset, st), min(im.end, end)
            if a >= b:
                continue
            held = r.image_features
            if held is None:
                held = r.image_features = {}
            if j not in held:
                held[j], new = cache.acquire(r, im)
                if new:  # encoded in `device_step`
                    encode.append((held[j], im))
            rows.append(np.arange(a - st, b - st, dtype=np.int64) + int(cu[i]))
            parts.append((r, j, held[j], a - im.offset, b - im.offset))
    if not parts:
        return None
    return ImagePlan(encode, np.concatenate(rows), parts, cache)


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
    """Encode the plan's new images (one batch) into their cache entries, then (rows,
    features) for the model; a request whose image's last placeholder this step reaches lets
    go of its entry."""
    ims = [im for _, im in plan.encode]
    if ims and getattr(model, "ragged_images", False):  # Qwen2-VL's: sizes differ
        features = model.encode_image_list([to_device(im.pixel_values) for im in ims],
                                           [im.grid for im in ims])  # fmt: skip
    elif ims:
        features = model.encode_images(to_device(np.stack([im.pixel_values for im in ims])))
    for (entry, _), f in zip(plan.encode, features if ims else ()):
        # a view of a batch of several would keep the whole batch alive while it is cached
        entry.features = f if len(ims) == 1 else f.clone()
    pieces = [entry.features[a:b] for _, _, entry, a, b in plan.parts]
    out = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    for r, j, entry, _, b in plan.parts:
        if b != entry.rows or r.image_features.pop(j, None) is None:
            continue
        if entry not in r.image_features.values():  # consumed (not also its image's twin)
            plan.cache.release(r, entry)
    return to_device(plan.rows), out
