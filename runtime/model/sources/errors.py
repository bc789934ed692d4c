"""Why a download failed, in a few classes a user (and the operator's condition) can act on.

Each :class:`DownloadError` carries the termination reason `ModelDownloadFailed` and one detail
(runtime/termination.py): `ModelDownloadFailed/NotFound: hf://org/name: ...`.
"""

from __future__ import annotations

import errno

from pagoda.runtime.termination import ReasonedError

REASON = "ModelDownloadFailed"
UNAUTHORIZED = "Unauthorized"  # 401/403: missing or wrong credentials, gated or private repo
NOT_FOUND = "NotFound"  # 404: no such repo/bucket/revision, or nothing the engine can read there
OUT_OF_SPACE = "OutOfSpace"  # the files do not fit the download directory (or it filled up)
UNREACHABLE = "Unreachable"  # the endpoint could not be reached (DNS, connection, timeout)
NOT_CACHED = "NotCached"  # offline (HF_HUB_OFFLINE=1) and no complete copy in the cache
FAILED = "Failed"  # anything else (a 5xx, a bad answer, an I/O error)
DETAILS = (UNAUTHORIZED, NOT_FOUND, OUT_OF_SPACE, UNREACHABLE, NOT_CACHED, FAILED)


class DownloadError(ReasonedError):
    """A model download that failed; `detail` is one of DETAILS."""

    reason = REASON

    def __init__(self, detail: str, message: str) -> None:
        if detail not in DETAILS:
            raise ValueError(f"unknown download failure {detail!r}")
        super().__init__(message, detail=detail)


def from_os_error(uri: str, error: OSError) -> DownloadError:
    """ENOSPC/EDQUOT → OutOfSpace; any other I/O error → Failed."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            OUT_OF_SPACE, f"{uri}: the download directory is full ({error.strerror or error})"
        )
    if error.errno in _NOT_WRITABLE and error.filename:
        return DownloadError(
            FAILED,
            f"{uri}: cannot write to the download directory: {error.strerror}: {error.filename} "
            "(--download-dir must be a directory this user can write)",
        )
    return DownloadError(FAILED, f"{uri}: {type(error).__name__}: {error}")


_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST)


def for_status(uri: str, status: int | None, what: str) -> DownloadError:
    """An HTTP status → the failure class (`what` says what was asked and what came back)."""
    if status in (401, 403):
        return DownloadError(UNAUTHORIZED, f"{uri}: access denied (HTTP {status}): {what}")
    if status == 404:
        return DownloadError(NOT_FOUND, f"{uri}: not found (HTTP 404): {what}")
    return DownloadError(FAILED, f"{uri}: HTTP {status}: {what}")
