"""The download directory (`--download-dir`, like vLLM's): its layout, completion manifests that
let a model be found again without network, and the free-space check before a download.

    DOWNLOAD_DIR/
      models--ORG--NAME/...            hf://  huggingface_hub's cache layout (blobs/, snapshots/COMMIT/)
      s3/BUCKET/PREFIX/...             s3://  the objects under PREFIX, by their path below it
      .pagoda/manifests/KEY.json       one per completed download: the URI, the local path
                                       (relative, so a volume mounted elsewhere still works),
                                       every file with its size, the commit (hf://)
      .pagoda/locks/KEY.lock           held (flock) while a process downloads into the directory

A manifest is written last, after every file is in place: a download cut short leaves none, so
an offline lookup (`HF_HUB_OFFLINE=1`) never returns a partial model. An hf:// download is
recorded under the revision asked for (none is `main`, as huggingface_hub reads it) and under
its commit, so `hf://ORG/NAME`, `@main` and `@COMMIT` all find it offline; a snapshot that
huggingface_hub itself put there (`hf download --cache-dir DIR`) is found through its `refs/`
(only for a repo this runtime never downloaded into DIR: one it did counts with a manifest only).

Pods that share the directory (a PersistentVolumeClaim) download one at a time (`download_lock`:
the others wait, then find the files there); the kernel drops a lock whose holder died.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from pagoda.runtime.model.sources.errors import OUT_OF_SPACE, DownloadError, from_os_error
from pagoda.runtime.model.sources.uri import COMMIT, HfURI, ModelURI, parse_uri

# A PEFT LoRA adapter's config, beside its adapter_model.safetensors (pagoda.runtime.lora): a
# folder with it and no config.json is an adapter (the operator's spec.adapters fetches them).
ADAPTER_CONFIG = "adapter_config.json"

DOWNLOAD_DIR_ENV = "PAGODA_DOWNLOAD_DIR"  # the default of --download-dir
OFFLINE_ENV = "HF_HUB_OFFLINE"  # 1: never touch the network, use the cache (hf:// and s3://)
MANIFESTS = Path(".pagoda") / "manifests"
LOCKS = Path(".pagoda") / "locks"
MANIFEST_VERSION = 1
DEFAULT_REVISION = "main"  # huggingface_hub's revision when none is given
log = logging.getLogger("pagoda.runtime.model.sources")


def default_download_dir() -> Path:
    """`$PAGODA_DOWNLOAD_DIR`, else `$XDG_CACHE_HOME/pagoda/models` (~/.cache/pagoda/models)."""
    if os.environ.get(DOWNLOAD_DIR_ENV):
        return Path(os.environ[DOWNLOAD_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagoda" / "models"


def offline_from_env() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def s3_dir(root: Path, bucket: str, prefix: str) -> Path:
    return root.joinpath("s3", bucket, *[p for p in prefix.split("/") if p])


def key_uri(ref: ModelURI) -> str:
    """The URI a download is recorded under: an hf:// one always names its revision."""
    if isinstance(ref, HfURI):
        return f"hf://{ref.repo}@{ref.revision or DEFAULT_REVISION}"
    return ref.uri


def _key_path(root: Path, folder: Path, uri: str, suffix: str) -> Path:
    readable = re.sub(r"[^A-Za-z0-9._@-]+", "--", uri.replace("://", "--", 1))[:150]
    digest = hashlib.sha256(uri.encode()).hexdigest()[:8]
    return root / folder / f"{readable}-{digest}{suffix}"


def manifest_path(root: Path, ref: ModelURI) -> Path:
    return _key_path(root, MANIFESTS, key_uri(ref), ".json")


def record(
    root: Path, ref: ModelURI, path: Path, files: Mapping[str, int], commit: str | None = None
) -> None:
    """Mark a download complete (atomically: a reader sees the old manifest or the new one),
    under `ref` and, for hf://, under its commit too."""
    refs = [ref]
    if isinstance(ref, HfURI) and commit and ref.revision != commit:
        refs.append(HfURI(ref.repo, commit))
    for each in refs:
        data = {
            "version": MANIFEST_VERSION,
            "uri": each.uri,
            "path": os.path.relpath(path, root),
            "commit": commit,
            "files": dict(sorted(files.items())),
            "completed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        target = manifest_path(root, each)
        if _same_manifest(target, data):
            continue  # nothing new: no write (the directory may be read-only)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, target)
        except OSError as e:
            raise from_os_error(ref.uri, e) from e


def _same_manifest(target: Path, data: Mapping[str, object]) -> bool:
    try:
        old = json.loads(target.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and all(
        old.get(k) == data[k]
        for k in ("version", "path", "commit", "files")  # same file: same key
    )


def lookup(root: Path, ref: ModelURI) -> Path | None:
    """The local copy of a completed download of `ref`, if every file is still there (from its
    manifest; for hf:// without one, a complete snapshot in huggingface_hub's own layout)."""
    legacy = _key_path(root, MANIFESTS, ref.uri, ".json")  # before revisions were named
    for manifest, uri in ((manifest_path(root, ref), key_uri(ref)), (legacy, ref.uri)):
        found = _from_manifest(root, manifest, uri)
        if found is not None:
            return found
    if isinstance(ref, HfURI) and not _key_path(root, LOCKS, _lock_uri(ref), ".lock").exists():
        return hub_snapshot(root, ref)  # a repo this runtime never downloaded into `root`
    return None  # (one it did counts only with its manifest: a download cut short has none)


def _from_manifest(root: Path, manifest: Path, uri: str) -> Path | None:
    try:
        data = json.loads(manifest.read_text())
        path = (root / data["path"]).resolve()
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        same = data.get("uri") == uri or key_uri(parse_uri(data.get("uri"))) == uri
    except (ValueError, TypeError, AttributeError):
        same = False
    if not same or not path.exists():
        return None
    base = path if path.is_dir() else path.parent
    for name, size in files.items():
        try:
            if (base / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return path


def hub_snapshot(root: Path, ref: HfURI) -> Path | None:
    """A snapshot huggingface_hub completed under `root` (its cache layout): the revision's
    commit (from refs/REVISION unless it is a commit) with config.json (a LoRA adapter's
    adapter_config.json) and every weights file
    the loader reads there (the shards its index names, else some *.safetensors; without
    safetensors, pytorch_model.bin or the shards its index names)."""
    storage = root / ("models--" + ref.repo.replace("/", "--"))
    revision = ref.revision or DEFAULT_REVISION
    try:
        commit = revision if COMMIT.match(revision) else (storage / "refs" / revision).read_text()
    except OSError:
        return None
    snapshot = storage / "snapshots" / commit.strip()
    if not any((snapshot / c).is_file() for c in ("config.json", ADAPTER_CONFIG)):
        return None
    index = snapshot / "model.safetensors.index.json"
    if not index.is_file() and not any(p.is_file() for p in snapshot.glob("*.safetensors")):
        if (snapshot / "pytorch_model.bin").is_file():
            return snapshot
        index = snapshot / "pytorch_model.bin.index.json"
    try:
        if index.is_file():
            shards = set(json.loads(index.read_text())["weight_map"].values())
            return snapshot if shards and all((snapshot / s).is_file() for s in shards) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return snapshot if any(p.is_file() for p in snapshot.glob("*.safetensors")) else None


def cached_commit(root: Path, ref: HfURI) -> str | None:
    """The commit a completed hf:// download recorded (None: none recorded)."""
    try:
        return json.loads(manifest_path(root, ref).read_text()).get("commit")
    except (OSError, ValueError):
        return None


def _lock_uri(ref: ModelURI) -> str:
    """What one lock guards: an hf:// repo (its blobs are shared by revisions), an s3:// folder
    (a .gguf object's is its parent's, which the folder's other objects share)."""
    if isinstance(ref, HfURI):
        return f"hf://{ref.repo}"
    folder = ref.prefix.rpartition("/")[0] if ref.prefix.endswith(".gguf") else ref.prefix
    return f"s3://{ref.bucket}/{folder}"


LOCK_POLL_S = 0.5
WAIT_LOG_INTERVAL_S = 30.0


def _wait_for_lock(fd: int, uri: str) -> None:
    """Until the lock is ours, with a log line every WAIT_LOG_INTERVAL_S (a pod's log would
    otherwise stay silent for as long as the other download takes)."""
    import fcntl

    start = last = time.monotonic()
    while True:
        time.sleep(LOCK_POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() - last >= WAIT_LOG_INTERVAL_S:
                last = time.monotonic()
                log.info("%s: still waiting for the other download (%.0f s)", uri, last - start)


@contextlib.contextmanager
def download_lock(root: Path, ref: ModelURI) -> Iterator[bool]:
    """Held while this process downloads `ref` into `root`: another process (a pod sharing the
    volume) waits for it, with a log line, instead of writing the same files at once. Yields
    whether the lock is held (False on a filesystem without locks: then what looks left over by
    a killed download may be another process's file in progress, not to be touched)."""
    import fcntl

    path = _key_path(root, LOCKS, _lock_uri(ref), ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):  # nothing can be written here:
            yield False  # no download to guard (a complete copy is found; else writing fails)
            return
        raise from_os_error(ref.uri, e) from e
    try:
        held = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("%s: another process is downloading it into %s; waiting", ref.uri, root)
            _wait_for_lock(fd, ref.uri)
        except OSError as e:  # ENOLCK, EOPNOTSUPP: a filesystem without locks
            log.warning("%s: cannot lock %s (%s); downloading without the lock", ref.uri, path, e)
            held = False
        yield held
    finally:
        os.close(fd)  # releases the lock


def disk_usage(path: Path) -> int:
    """Bytes the files under `path` occupy (blocks, as a volume's size limit counts them)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
    return total


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_space(uri: str, root: Path, needed: int, size_limit: int | None = None) -> None:
    """OutOfSpace before any byte is written when `needed` more bytes do not fit: the volume's
    free space and, with `size_limit` (an emptyDir's sizeLimit), what is left of that limit."""
    if needed <= 0:
        return
    try:
        free = shutil.disk_usage(root).free
    except OSError as e:
        raise from_os_error(uri, e) from e
    room, where = free, f"{human(free)} free in {root}"
    if size_limit is not None:
        used = disk_usage(root)
        left = max(0, size_limit - used)
        if left < room:
            room = left
            where = (
                f"{human(left)} left of the {human(size_limit)} size limit of {root} "
                f"({human(used)} used)"
            )
    if needed > room:
        raise DownloadError(OUT_OF_SPACE, f"{uri}: needs {human(needed)} more but only {where}")


def ensure_dir(uri: str, root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise from_os_error(uri, e) from e


__all__ = [
    "DOWNLOAD_DIR_ENV",
    "OFFLINE_ENV",
    "cached_commit",
    "check_space",
    "default_download_dir",
    "disk_usage",
    "download_lock",
    "ensure_dir",
    "hub_snapshot",
    "human",
    "key_uri",
    "lookup",
    "manifest_path",
    "offline_from_env",
    "record",
    "s3_dir",
]
