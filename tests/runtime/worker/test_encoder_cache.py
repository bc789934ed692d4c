"""The encoder cache (runtime/worker/encoder_cache.py): images shared by content hash,
an entry kept while a running request reads it, unused entries kept within the budget and
dropped least recently used first past it."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from pagoda.runtime.multimodal.image_inputs import ImageInput
from pagoda.runtime.worker.encoder_cache import EncoderCache


class Req:
    """A request as the cache sees it: weakly referenced, finished or not."""

    is_finished = False


def _image(tag: bytes, rows: int) -> ImageInput:
    return ImageInput(np.zeros(1, np.float32), 0, rows, tag.ljust(16, b"\0"))


def test_one_image_is_one_entry_however_many_requests_hold_it():
    cache, a, b = EncoderCache(10), Req(), Req()
    first, new = cache.acquire(a, _image(b"x", 4))
    second, again = cache.acquire(b, _image(b"x", 4))
    assert new and not again and first is second and cache.rows == 4
    other, new = cache.acquire(a, _image(b"y", 4))
    assert new and other is not first and (cache.queries, cache.hits) == (3, 1)
    with pytest.raises(ValueError, match=">= 0 rows"):
        EncoderCache(-1)


def test_entries_in_use_are_kept_past_the_budget_and_unused_ones_dropped_oldest_first():
    cache, a, b = EncoderCache(8), Req(), Req()
    x, _ = cache.acquire(a, _image(b"x", 4))
    x.features = "x-features"
    y, _ = cache.acquire(b, _image(b"y", 4))
    z, _ = cache.acquire(b, _image(b"z", 6))  # 14 rows: both others in use, none dropped
    assert cache.rows == 14 and len(cache.entries) == 3
    cache.release(a, x)  # x unused and the oldest: dropped (over budget)
    assert list(cache.entries) == [y.key, z.key] and cache.rows == 10 and x.features is None
    cache.release(b, y)
    assert list(cache.entries) == [z.key] and cache.rows == 6
    cache.release(b, z)  # within the budget: kept for a later request
    assert list(cache.entries) == [z.key]
    again, new = cache.acquire(a, _image(b"z", 6))
    assert again is z and not new


def test_a_finished_or_collected_request_holds_nothing():
    cache, a, b = EncoderCache(4), Req(), Req()
    cache.acquire(a, _image(b"x", 4))
    cache.acquire(b, _image(b"y", 4))
    a.is_finished = True  # (aborted before its image was consumed)
    del b
    gc.collect()
    cache.acquire(Req(), _image(b"z", 4))
    assert [e.key[:1] for e in cache.entries.values()] == [b"z"]
    cache.reset_counters()
    assert (cache.queries, cache.hits) == (0, 0)
