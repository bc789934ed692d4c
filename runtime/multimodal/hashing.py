"""The prefix cache's key of the images a block holds: a block whose tokens are image
placeholders is named by the images' content too (`kv_cache_manager.hash_block`'s `extra`), so
two prompts with the same placeholders but different images never share KV, while the same
image after the same prefix does."""

from __future__ import annotations

from pagoda.runtime.multimodal.inputs import MultiModalInputs


def block_extra(mm: MultiModalInputs, start: int, stop: int) -> bytes:
    """The content hashes (and first positions) of the images overlapping prompt positions
    [start, stop); b"" where none does."""
    parts = [
        im.content_hash + im.offset.to_bytes(8, "little")
        for im in mm.images
        if im.offset < stop and im.end > start
    ]
    return b"".join(parts)
