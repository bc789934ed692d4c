"""Encoded images shared across requests by content (vLLM's EncoderCacheManager idea): the
tower's features of an image, keyed by its content hash (of its pixels and Qwen2-VL's grid), so
that requests holding the same image, in one step or in later ones, encode it once.

An entry's size is its feature rows (its placeholder tokens). Each request that reaches one of
an image's placeholders becomes a user of its entry until a step consumes the image's last
placeholder (`mm_encoder.device_step` releases it) or the request finishes (a finished or
garbage-collected request counts as no user). An entry no running request uses stays cached
for later requests while the budget holds it; past the budget, such entries are dropped least
recently used first. An entry in use is never dropped (its request still reads it), so the
rows held may pass the budget by what the running requests need, as each request held its own
features before. All of this is host bookkeeping on rank 0 (the tower runs there): no device
work, no sync.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

from pagoda.runtime.multimodal import inputs
from pagoda.runtime.multimodal.image_inputs import ImageInput


class Entry:
    """One image's features ([rows, hidden] on the device; None until its step encodes it)."""

    __slots__ = ("features", "key", "rows", "users")

    def __init__(self, key: bytes, rows: int) -> None:
        self.key, self.rows = key, rows
        self.features: Any = None
        self.users: weakref.WeakSet = weakref.WeakSet()  # the requests that still read it

    def in_use(self) -> bool:
        return any(not r.is_finished for r in self.users)


class EncoderCache:
    def __init__(self, budget_rows: int) -> None:
        if budget_rows < 0:
            raise ValueError(f"the encoder cache's budget must be >= 0 rows, got {budget_rows}")
        self.budget = budget_rows
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()  # least recently used first
        self.rows = 0  # feature rows of the entries held
        self.queries = self.hits = 0  # images looked up, and found encoded (or being encoded)

    @classmethod
    def for_model(cls, config: Any, model_config: Any) -> EncoderCache:
        """vLLM's default size: the rows of a step's tokens (`max_num_batched_tokens`), or of
        the largest image the model's processor makes where that is more."""
        largest = inputs.max_run(model_config.vision)
        return cls(max(config.scheduler.max_num_batched_tokens, largest))

    def acquire(self, request: Any, image: ImageInput) -> tuple[Entry, bool]:
        """`image`'s entry with `request` among its users, and whether it is new (to encode
        this step)."""
        key = image.content_hash
        self.queries += 1
        entry = self.entries.get(key)
        new = entry is None
        if new:
            self._shrink(image.length)
            entry = self.entries[key] = Entry(key, image.length)
            self.rows += image.length
        else:
            self.hits += 1
            self.entries.move_to_end(key)
        entry.users.add(request)
        return entry, new

    def release(self, request: Any, entry: Entry) -> None:
        """`request` reads `entry` no more (its last placeholder consumed)."""
        entry.users.discard(request)
        self._shrink(0)

    def _shrink(self, extra: int) -> None:
        """Drop unused entries, least recently used first, until `extra` more rows fit."""
        if self.rows + extra <= self.budget:
            return
        for key, entry in list(self.entries.items()):
            if entry.in_use():
                continue
            del self.entries[key]
            self.rows -= entry.rows
            entry.features = None
            if self.rows + extra <= self.budget:
                return

    def reset_counters(self) -> None:
        self.queries = self.hits = 0
