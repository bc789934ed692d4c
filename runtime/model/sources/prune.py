"""Old snapshots of an hf:// repo removed from a shared download directory (`pagoda download
--prune`, the operator's `spec.modelCache.prune`), never one a running process reads.

A snapshot is in use while some process holds a shared `flock` on its in-use file
(`DIR/.pagoda/locks/hf--ORG--NAME@COMMIT-HASH.inuse`, made by the download that completed it):
every process that resolves an hf:// model to a snapshot (`pagoda serve`, `pagoda tune`, `LLM`)
takes one and keeps it until it exits (`hold`; the kernel drops it then, on NFSv4 and CephFS too,
where flock locks the whole file for every client). `prune` runs after a download, under the
repo's download lock, and removes each other snapshot of the repo whose in-use file it can lock
exclusively: the snapshot, the manifests and `refs/` that name its commit, and then every blob
that no remaining snapshot links to. A snapshot whose lock is held (an older replica still
serving it) is kept, and removed by a later prune once nothing holds it.

Not the default: a claim can be shared with readers that take no lock (a notebook, another
tool reading huggingface_hub's layout), and what they read would go away under them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
from pathlib import Path

from pagoda.runtime.model.sources import cache

INUSE = ".inuse"
log = logging.getLogger("pagoda.runtime.model.sources")
_held: dict[str, int] = {}  # in-use file → fd, for the life of the process


def inuse_path(root: Path, repo: str, commit: str) -> Path:
    return cache._key_path(root, cache.LOCKS, f"hf://{repo}@{commit}", INUSE)


def snapshot_of(path: Path) -> tuple[Path, str] | None:
    """(repo storage folder, commit) of a snapshot path `…/models--ORG--NAME/snapshots/COMMIT`."""
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent, path.name
    return None


def _repo(storage: Path) -> str:
    return storage.name.removeprefix("models--").replace("--", "/", 1)


def create_inuse(root: Path, repo: str, commit: str) -> None:
    """Make the snapshot's in-use file (the downloader does: readers may not be able to write)."""
    path = inuse_path(root, repo, commit)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)


def hold(root: Path, snapshot: Path) -> None:
    """Mark `snapshot` in use by this process until it exits (shared flock on its in-use file,
    opened read-only: the serving container's mount is). Nothing where there is no in-use file
    (a snapshot another tool put there) or no locking."""
    found = snapshot_of(snapshot)
    if found is None:
        return
    storage, commit = found
    path = inuse_path(root, _repo(storage), commit)
    if str(path) in _held:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits out a prune deciding about this very snapshot
    except OSError:
        os.close(fd)
        return
    _held[str(path)] = fd


def release_all() -> None:
    """Let go of every snapshot this process holds (tests; a process exiting does it anyway)."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)


def prune(root: Path, repo: str, keep: str) -> list[str]:
    """Remove the snapshots of `repo` under `root` other than commit `keep` that no process
    holds; then the blobs no remaining snapshot links to. Returns the commits removed. The caller
    holds the repo's download lock."""
    storage = root / ("models--" + repo.replace("/", "--"))
    snapshots = storage / "snapshots"
    removed: list[str] = []
    others = sorted(p for p in snapshots.iterdir() if p.name != keep) if snapshots.is_dir() else []
    for snapshot in others:
        path = inuse_path(root, repo, snapshot.name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        except OSError as e:
            log.warning("%s: cannot lock %s (%s); keeping it", repo, snapshot.name[:12], e)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    log.warning("%s: cannot lock %s (%s); keeping it", repo, snapshot.name[:12], e)
                else:
                    log.info("%s: snapshot %s is in use; keeping it", repo, snapshot.name[:12])
                continue
            _forget(root, storage, repo, snapshot.name)
            shutil.rmtree(snapshot, ignore_errors=True)
            path.unlink(missing_ok=True)
            removed.append(snapshot.name)
        finally:
            os.close(fd)
    if removed:
        freed = _remove_unlinked_blobs(storage)
        log.info(
            "%s: pruned %d old snapshot%s (%s), %s freed", repo, len(removed),
            "" if len(removed) == 1 else "s", ", ".join(c[:12] for c in removed), cache.human(freed),
        )  # fmt: skip
    return removed


def _forget(root: Path, storage: Path, repo: str, commit: str) -> None:
    """The manifests and refs/ that name `commit` (first: an offline lookup never finds a
    snapshot that is going away)."""
    manifests = root / cache.MANIFESTS
    for manifest in manifests.glob("hf--*.json") if manifests.is_dir() else ():
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        uri = str(data.get("uri") or "") if isinstance(data, dict) else ""
        if data.get("commit") == commit and uri.split("@")[0] == f"hf://{repo}":
            manifest.unlink(missing_ok=True)
    refs = storage / "refs"
    for ref in refs.rglob("*") if refs.is_dir() else ():
        with contextlib.suppress(OSError):
            if ref.is_file() and ref.read_text().strip() == commit:
                ref.unlink()


def _remove_unlinked_blobs(storage: Path) -> int:
    """Blobs no snapshot links to (`*.incomplete` ones are resume.py's to judge). Bytes freed."""
    files = [p for p in (storage / "snapshots").rglob("*") if not p.is_dir()]
    if any(not p.is_symlink() for p in files):
        return 0  # copies, not links (a filesystem without symlinks): nothing is known unused
    linked = {os.path.basename(os.readlink(p)) for p in files}
    freed = 0
    blobs = storage / "blobs"
    for blob in blobs.iterdir() if blobs.is_dir() else ():
        if blob.name in linked or blob.name.endswith(".incomplete"):
            continue
        with contextlib.suppress(OSError):
            size = blob.stat().st_size
            blob.unlink()
            freed += size
    return freed
