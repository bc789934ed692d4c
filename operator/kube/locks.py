"""One asyncio lock per InferenceService, shared by every writer in this process.

The reconciler and the autoscaler both read-decide-write an InferenceService and its Deployment;
holding this lock they never interleave (across processes, resourceVersion preconditions and
the one-writer-per-field rule keep them apart).
"""

from __future__ import annotations

import asyncio
import weakref

_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


def object_lock(uid: str) -> asyncio.Lock:
    """The lock of the InferenceService with this uid (held only while someone uses it)."""
    lock = _locks.get(uid)
    if lock is None:
        lock = _locks[uid] = asyncio.Lock()
    return lock
