"""An hf:// download that a killed process cut short goes on from where it stopped.

huggingface_hub resumes a file with an HTTP Range request when the connection drops while it is
downloading (`http_get`'s retries), but not across processes: each download writes to its own
`blobs/ETAG.RANDOM.incomplete` and a process that is killed (an evicted pod, a node drain, ^C)
leaves it behind, never read again. For the files still to download, the largest such leftover of
each file is adopted (`adopt`; every other leftover is removed) and completed (`complete`) with
huggingface_hub's own `http_get(resume_size=...)`: a Range request for the rest, the whole file
again if the server ignores the Range. A completed file is checked against its SHA-256 (the ETag
the Hub gives an LFS file, safetensors weights among them) before it becomes the blob that
`snapshot_download` then links into the snapshot; one that does not match is removed and
downloaded anew, as is one the server refuses to resume (an HTTP error). Leftovers of
files with another ETag (a small git file) are removed.
The caller holds the repo's download lock (cache.download_lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

INCOMPLETE = ".incomplete"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
log = logging.getLogger("pagoda.runtime.model.sources")


@dataclass(frozen=True)
class Partial:
    """A leftover to complete: the bytes there, the file it is the start of."""

    path: Path
    name: str  # the file in the repo
    etag: str  # its SHA-256: the blob's name
    size: int  # the whole file's
    url: str  # where its bytes are (after the Hub's redirect)
    headers: dict[str, str]

    @property
    def have(self) -> int:
        return self.path.stat().st_size


def leftovers(blobs: Path) -> list[Path]:
    return sorted(blobs.glob(f"*{INCOMPLETE}")) if blobs.is_dir() else []


def remove(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def adopt(
    blobs: Path, names: Iterable[str], url_of: Callable[[str], str], token: str | None
) -> list[Partial]:
    """The leftovers in `blobs` worth completing, one per file of `names` (`url_of(name)`: its
    resolve URL, asked about with a HEAD only while leftovers remain unmatched); every other
    leftover is removed."""
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.utils import build_hf_headers

    found = leftovers(blobs)
    if not found:
        return []
    by_etag: dict[str, list[Path]] = {}
    for path in found:
        by_etag.setdefault(path.name.split(".", 1)[0], []).append(path)
    adopted: list[Partial] = []
    for name in names:
        if not any(_SHA256.match(etag) for etag in by_etag):
            break
        url = url_of(name)
        meta = get_hf_file_metadata(url, token=token)
        etag, size = str(meta.etag or ""), meta.size
        paths = by_etag.pop(etag, [])
        if not paths or not _SHA256.match(etag) or not size or (blobs / etag).exists():
            remove(paths)
            continue
        paths.sort(key=lambda p: p.stat().st_size, reverse=True)
        best, rest = paths[0], paths[1:]
        remove(rest)
        if not 0 < best.stat().st_size < size:
            remove([best])
            continue
        stable = blobs / f"{etag}.resume{INCOMPLETE}"
        if best != stable:
            os.replace(best, stable)
        headers = build_hf_headers(token=token)
        if urlsplit(meta.location).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed CDN URL: no token to another host
        adopted.append(Partial(stable, name, etag, int(size), meta.location, headers))
    remove(p for paths in by_etag.values() for p in paths)
    return adopted


def complete(partial: Partial, tqdm_class: type | None = None) -> None:
    """Download the rest of `partial` (Range) and make it the blob, if its SHA-256 matches."""
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.file_download import http_get

    have = partial.have
    log.info(
        "%s: resuming at %d of %d bytes (left by a download cut short)",
        partial.name, have, partial.size,
    )  # fmt: skip
    try:
        with partial.path.open("r+b") as f:
            f.seek(have)
            http_get(
                partial.url,
                f,
                resume_size=have,
                headers=partial.headers,
                expected_size=partial.size,
                displayed_filename=partial.name,
                tqdm_class=tqdm_class,
            )
    except HfHubHTTPError as e:  # refused (a CDN that wants what only the library's path sends)
        log.warning("%s: cannot resume (%s); downloading it again", partial.name, e)
        remove([partial.path])
        return
    if _sha256(partial.path) != partial.etag:
        log.warning(
            "%s: the resumed file does not match its SHA-256; downloading it again", partial.name
        )
        remove([partial.path])
        return
    os.replace(partial.path, partial.path.parent / partial.etag)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()
