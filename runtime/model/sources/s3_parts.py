"""One s3:// object downloaded in ranged parts, so that a download cut short goes on where it
stopped instead of fetching the whole object again.

boto3's `download_file` fetches a large object in concurrent ranged GETs, but into a file of its
own with holes where parts are missing and no record of which arrived: a killed process (an
evicted pod, a node drain, ^C) leaves nothing that can be trusted. Here the parts (`PART_BYTES`
each, `WORKERS` at a time, as s3transfer does) are written into `.NAME.partial` at their offsets
and each one, once on disk (fdatasync), is appended to `.NAME.partial.parts`, whose first line
names the object's ETag, its size and the part size. A later download of the same object reads
that journal and fetches only the parts not in it. Every GET carries `If-Match: ETAG`, so a part
of another version of the object is never written: an object replaced meanwhile is answered 412,
and a journal of another ETag (or size, or part size) is thrown away with its file, so a changed
object starts over. The caller holds the folder's download lock (cache.download_lock).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from pagoda.runtime.model.sources import errors
from pagoda.runtime.model.sources.errors import DownloadError

PART_BYTES = 8 << 20  # one ranged GET (as s3transfer's multipart_chunksize)
WORKERS = 8  # GETs at once (s3transfer's max_concurrency is 10)
READ_BYTES = 1 << 20  # read from a response, written and counted at a time
RETRIES = 3  # a part whose body broke off is asked for again this many times
JOURNAL = ".parts"  # `.NAME.partial.parts` beside `.NAME.partial`


def journal_of(partial: Path) -> Path:
    return partial.with_name(partial.name + JOURNAL)


def _header(etag: str, size: int, part: int) -> str:
    return f"{etag}\t{size}\t{part}\n"


def done_parts(partial: Path, etag: str, size: int, part: int) -> set[int]:
    """The parts a download cut short left on disk (empty, and its files removed, unless they
    are of this very object: same ETag, size and part size)."""
    journal = journal_of(partial)
    try:
        lines = journal.read_text().splitlines(keepends=True)
        fits = partial.stat().st_size == size
    except OSError:
        lines, fits = [], False
    if not lines or lines[0] != _header(etag, size, part) or not fits:
        remove(partial)
        return set()
    count = -(-size // part)
    # a last line without its newline was cut short by the kill: not counted
    return {int(x) for x in lines[1:] if x.endswith("\n") and x.strip().isdigit()} & set(
        range(count)
    )


def remove(partial: Path) -> None:
    for path in (partial, journal_of(partial)):
        with contextlib.suppress(OSError):
            path.unlink()


def download(
    s3: Any,
    bucket: str,
    key: str,
    size: int,
    etag: str,
    partial: Path,
    callback: Callable[[int], None],
    *,
    part: int | None = None,
    workers: int | None = None,
) -> int:
    """Fetch the parts of `key` not yet in `partial` (whose journal says which are); the file is
    complete when this returns. Returns the bytes it fetched. `callback(n)` counts bytes as they
    arrive (from worker threads); an exception from it stops the download, as a kill would."""
    part, workers = part or PART_BYTES, workers or WORKERS
    have = done_parts(partial, etag, size, part)
    if not have:
        partial.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("wb") as f:
            f.truncate(size)
        journal_of(partial).write_text(_header(etag, size, part))
    todo = [i for i in range(-(-size // part)) if i not in have]
    fetched = [0]
    lock = threading.Lock()
    fd = os.open(partial, os.O_WRONLY)
    try:
        with journal_of(partial).open("a") as journal:

            def one(i: int) -> None:
                start, end = i * part, min(size, (i + 1) * part) - 1
                got = _get_range(s3, bucket, key, etag, start, end, fd, callback)
                os.fdatasync(fd)  # the bytes are on disk before the journal says so
                with lock:
                    fetched[0] += got
                    journal.write(f"{i}\n")
                    journal.flush()

            _run(one, todo, workers)
    finally:
        os.close(fd)
    return fetched[0]


def _run(one: Callable[[int], None], todo: list[int], workers: int) -> None:
    if len(todo) <= 1:
        for i in todo:
            one(i)
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, len(todo)), thread_name_prefix="s3-part")
    try:
        futures = [pool.submit(one, i) for i in todo]
        finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for future in finished:
            future.result()  # the first failure, raised here
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _get_range(
    s3: Any,
    bucket: str,
    key: str,
    etag: str,
    start: int,
    end: int,
    fd: int,
    callback: Callable[[int], None],
) -> int:
    """Bytes start..end of the object (this ETag's) written at their offset; a body that breaks
    off is asked for again (from where it broke) up to RETRIES times."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    offset, got = start, 0
    for attempt in range(RETRIES + 1):
        try:
            response = s3.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}", IfMatch=etag
            )
        except ClientError as e:
            status = (e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if status == 412:
                raise DownloadError(
                    errors.FAILED,
                    f"s3://{bucket}/{key} changed while it was being downloaded (its ETag is no "
                    f"longer {etag}): run the download again",
                ) from e
            raise
        body = response["Body"]
        try:
            while offset <= end and (chunk := body.read(min(READ_BYTES, end + 1 - offset))):
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
                got += len(chunk)
                callback(len(chunk))
        except (ResponseStreamingError, ReadTimeoutError, ConnectionError):
            if attempt == RETRIES:
                raise
        finally:
            body.close()
        if offset > end:
            return got
    raise DownloadError(
        errors.FAILED, f"s3://{bucket}/{key}: the store sent fewer bytes than the object has"
    )
