"""Triton's on-disk kernel cache as one archive: packed by `pagoda tune`, installed by serving.

Why: before `/ready` the warm-up (`engine/warmup.py`) launches every attention variant the
configured shapes can reach, and on a fresh pod Triton JIT-compiles each one (on the H200, 12.1 s
of a 20.5 s start for a 1B model). The tuning Job runs that same warm-up in a process of its own
whose ``TRITON_CACHE_DIR`` starts empty, packs what Triton wrote there into the profile, and a
server installs it into its own cache directory before warming up: Triton then finds each
kernel on disk instead of compiling it.

The archive (``tar.xz``)::

    manifest.json           {"format", "identity": {triton, target, pagoda}, "entries", ...}
    <hash>/<kernel>.json    Triton's metadata of one compiled kernel
    <hash>/<kernel>.cubin   its binary (``.hsaco`` on ROCm)
    <hash>/__grp__<kernel>.json   the group Triton looks up, child paths relative to <hash>/
    <hash>/<module>.so      a compiled launcher/driver module (no group)

Triton's cache key already covers the kernel's source, its specialisation, the compiler and
the GPU architecture, so an entry either is exactly what this process would compile or is never
looked up. The identity check refuses a whole archive built for another Triton, GPU architecture
or Pagoda before anything is written. The IR files (ttir, ttgir, llir, ptx, source) are left out:
a cache hit reads only the metadata and the binary (Triton's own ``TRITON_STORE_BINARY_ONLY``).

Install never fails a server: a mismatch or a corrupt, truncated or hostile archive is one
warning line and the warm-up compiles as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import lzma
import os
import re
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = "pagoda-kernel-cache/1"
MANIFEST = "manifest.json"
GROUP_PREFIX = "__grp__"
BINARY = (".cubin", ".hsaco")  # CUDA, ROCm
KEEP_SUFFIXES = (".json", *BINARY)  # metadata + binary: what a cache hit reads
MODULE_SUFFIX = ".so"  # Triton's compiled C modules (driver utilities, launchers)
MAX_MEMBERS = 20_000
MAX_UNPACKED_BYTES = 512 * 1024 * 1024  # a hostile archive must not fill the disk
_ENTRY = re.compile(r"^[0-9A-Za-z_-]{8,128}$")  # Triton's entry folders: a hash
_FILE = re.compile(r"^[^/\\]{1,255}$")


# what a corrupt, truncated or hostile archive raises while it is read (KernelCacheError too)
_UNREADABLE = (OSError, EOFError, tarfile.TarError, lzma.LZMAError, zlib.error, ValueError,
               KeyError, TypeError)  # fmt: skip


class KernelCacheError(ValueError):
    """An archive that cannot be packed or installed (the message says why)."""


@dataclass(frozen=True)
class Identity:
    """What the kernels in an archive were compiled for and with."""

    triton: str
    target: str  # Triton's GPUTarget as "backend:arch", e.g. "cuda:90"
    pagoda: str | None = None

    def describe(self) -> str:
        return f"triton {self.triton}, {self.target.replace(':', ' ')}"

    def differences(self, other: Identity) -> list[str]:
        """Readable differences between this (the archive's) and ``other`` (this process's)."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k} {mine[k]!r} (archive) != {theirs[k]!r} (here)" for k in mine
                if mine[k] != theirs[k]]  # fmt: skip


@dataclass(frozen=True)
class Packed:
    """An archive written by `pack`: what `pagoda tune` records in ``profile.json``."""

    path: Path
    identity: Identity
    entries: int  # cache folders
    kernels: int  # compiled kernels (groups)
    bytes: int  # the archive's size
    unpacked_bytes: int
    sha256: str

    def section(self) -> dict:
        """The profile's ``kernel_cache`` object."""
        return {
            "status": "packed",
            "file": self.path.name,
            "kernels": self.kernels,
            "entries": self.entries,
            "bytes": self.bytes,
            "unpacked_bytes": self.unpacked_bytes,
            "sha256": self.sha256,
            **{k: v for k, v in asdict(self.identity).items()},
        }


@dataclass(frozen=True)
class Installed:
    """What `install` put into (or found already in) a cache directory."""

    identity: Identity
    kernels: int
    entries: int
    files_written: int
    seconds: float

    def describe(self) -> str:
        return f"{self.kernels} kernels from the tuned profile ({self.identity.describe()})"


# -- this process ------------------------------------------------------------------------------


def pagoda_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("pagoda")
    except metadata.PackageNotFoundError:
        return None


def triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def target_of(device) -> str | None:
    """The Triton target a torch device compiles for ("cuda:90"), None off a GPU. Read from
    torch, not from Triton's driver: that would compile Triton's driver module, itself in the
    archive."""
    if getattr(device, "type", device) != "cuda":
        return None
    import torch

    if getattr(torch.version, "hip", None):
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return f"hip:{arch}"
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:{major * 10 + minor}"


def identity_for(target: str) -> Identity | None:
    """This process's identity for ``target`` (None without Triton)."""
    version = triton_version()
    return None if version is None else Identity(version, target, pagoda_version())


def triton_cache_dir() -> Path:
    """Where Triton reads and writes its cache in this process (its knob reads
    ``TRITON_CACHE_DIR``, else Triton's default under ``~/.triton``)."""
    from triton import knobs

    return Path(knobs.cache.dir)


# -- pack --------------------------------------------------------------------------------------


def _entry_files(entry: Path) -> tuple[dict[str, bytes], int]:
    """{file name: content} of one cache folder worth shipping, groups rewritten with relative
    child paths and pruned to metadata + binary; and the number of kernels (groups) in it."""
    out: dict[str, bytes] = {}
    kernels = 0
    for grp in sorted(entry.glob(GROUP_PREFIX + "*.json")):
        try:
            children = json.loads(grp.read_text())["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a group Triton could not use either
        keep = {}
        for name, path in children.items():
            src = Path(path)
            if not name.endswith(KEEP_SUFFIXES):
                continue
            if src.parent.resolve() != entry.resolve() or not src.is_file() or "/" in name:
                keep = {}
                break
            keep[name] = src.name
        if not (any(n.endswith(".json") for n in keep) and any(n.endswith(BINARY) for n in keep)):
            continue  # no metadata or no binary: not a usable kernel
        for rel in keep.values():
            out[rel] = (entry / rel).read_bytes()
        out[grp.name] = json.dumps({"child_paths": keep}, sort_keys=True).encode()
        kernels += 1
    if not kernels:  # a compiled C module: found by file name alone
        for path in sorted(entry.glob("*" + MODULE_SUFFIX)):
            if path.is_file():
                out[path.name] = path.read_bytes()
    return out, kernels


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0  # reproducible
    tar.addfile(info, io.BytesIO(data))


def pack(
    cache_dir: str | os.PathLike[str], out_file: str | os.PathLike[str], identity: Identity
) -> Packed:
    """Archive the usable entries of Triton cache ``cache_dir`` into ``out_file`` (written
    atomically). KernelCacheError when there is nothing to pack."""
    cache, out = Path(cache_dir), Path(out_file)
    entries: dict[str, dict[str, bytes]] = {}
    kernels = 0
    if cache.is_dir():
        for entry in sorted(p for p in cache.iterdir() if p.is_dir() and _ENTRY.match(p.name)):
            files, n = _entry_files(entry)
            if files:
                entries[entry.name], kernels = files, kernels + n
    if not entries:
        raise KernelCacheError(f"{cache}: no compiled kernel to pack")
    manifest = {
        "format": FORMAT,
        "identity": asdict(identity),
        "kernels": kernels,
        "entries": {name: sorted(files) for name, files in entries.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".tmp-", suffix=".tar.xz")
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w:xz", preset=9) as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            for name, files in entries.items():
                for file, data in sorted(files.items()):
                    _add(tar, f"{name}/{file}", data)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    data = out.read_bytes()
    return Packed(
        path=out,
        identity=identity,
        entries=len(entries),
        kernels=kernels,
        bytes=len(data),
        unpacked_bytes=sum(len(d) for files in entries.values() for d in files.values()),
        sha256=hashlib.sha256(data).hexdigest(),
    )


# -- install -----------------------------------------------------------------------------------


def read_manifest(tar: tarfile.TarFile) -> dict:
    """The manifest, and every member checked to be a plain file at ``<entry>/<file>`` that it
    lists (before anything is extracted); KernelCacheError otherwise."""
    members = tar.getmembers()
    if not members or members[0].name != MANIFEST or not members[0].isfile():
        raise KernelCacheError(f"no {MANIFEST} first: not a Pagoda kernel-cache archive")
    if len(members) > MAX_MEMBERS:
        raise KernelCacheError(f"{len(members)} members, more than {MAX_MEMBERS}")
    fh = tar.extractfile(members[0])
    try:
        manifest = json.loads(fh.read(1 << 20)) if fh else None
    except ValueError as e:
        raise KernelCacheError(f"{MANIFEST}: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise KernelCacheError(f"{MANIFEST}: format is not {FORMAT!r}")
    listed = manifest.get("entries")
    if not isinstance(listed, dict) or not isinstance(manifest.get("identity"), dict):
        raise KernelCacheError(f"{MANIFEST}: no entries or no identity")
    total = 0
    for m in members[1:]:
        entry, _, file = m.name.partition("/")
        if not (m.isfile() and _ENTRY.match(entry) and _FILE.match(file)
                and file not in (".", "..") and file in (listed.get(entry) or ())):  # fmt: skip
            raise KernelCacheError(f"member {m.name!r} is not a cache file the manifest lists")
        total += m.size
    if total > MAX_UNPACKED_BYTES:
        raise KernelCacheError(f"{total} bytes unpacked, more than {MAX_UNPACKED_BYTES}")
    return manifest


def archive_identity(manifest: dict) -> Identity:
    ident = manifest["identity"]
    try:
        return Identity(str(ident["triton"]), str(ident["target"]), ident.get("pagoda"))
    except KeyError as e:
        raise KernelCacheError(f"{MANIFEST}: identity has no {e}") from e


def _place(src: Path, dest: Path) -> int:
    """Move one extracted entry into the cache: each file atomically, groups last with absolute
    child paths (Triton trusts a group only if every child exists); files already there are
    kept. The number of files written."""
    dest.mkdir(parents=True, exist_ok=True)
    written = 0
    files = sorted(src.iterdir(), key=lambda p: (p.name.startswith(GROUP_PREFIX), p.name))
    for path in files:
        target = dest / path.name
        if path.name.startswith(GROUP_PREFIX):
            children = json.loads(path.read_text())["child_paths"]
            if not all(isinstance(v, str) and _FILE.match(v) for v in children.values()):
                raise KernelCacheError(f"{src.name}/{path.name}: a child path is not a file name")
            absolute = {k: str(dest / v) for k, v in children.items()}
            if not all(Path(p).is_file() for p in absolute.values()):
                continue  # an incomplete group is worse than none
            path.write_text(json.dumps({"child_paths": absolute}))
        if target.exists():
            continue
        os.replace(path, target)
        written += 1
    return written


def install(
    archive: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str],
    identity: Identity,
    sha256: str | None = None,
) -> Installed | None:
    """Install ``archive`` into Triton cache ``cache_dir`` if it was built for ``identity``
    (and its digest is ``sha256``, when given: the one its profile recorded); None (after one
    warning line) when it was not, or cannot be read. Never raises for a bad archive: serving
    then compiles as it would without one."""
    start = time.monotonic()
    archive, cache = Path(archive), Path(cache_dir)
    try:
        if sha256 is not None and hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
            raise KernelCacheError("its digest is not the one its profile recorded")
        cache.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, mode="r:*") as tar:
            manifest = read_manifest(tar)
            have = archive_identity(manifest)
            if have != identity:
                log.warning(
                    "kernel cache %s: built for another setup (%s); kernels compile at start",
                    archive, "; ".join(have.differences(identity)),
                )  # fmt: skip
                return None
            with tempfile.TemporaryDirectory(dir=cache, prefix=".pagoda-install-") as tmp:
                tar.extractall(tmp, filter="data")
                written = sum(_place(entry, cache / entry.name)
                              for entry in sorted(Path(tmp).iterdir())
                              if entry.is_dir())  # the manifest is read, not installed  # fmt: skip
    except _UNREADABLE as e:
        log.warning("kernel cache %s: skipped (%s: %s); kernels compile at start",
                    archive, type(e).__name__, e)  # fmt: skip
        return None
    return Installed(
        identity=have,
        kernels=int(manifest.get("kernels") or 0),
        entries=len(manifest["entries"]),
        files_written=written,
        seconds=time.monotonic() - start,
    )


def cached_entries(cache_dir: str | os.PathLike[str]) -> set[str]:
    """The entry folders of a Triton cache (to count what a warm-up compiled)."""
    cache = Path(cache_dir)
    if not cache.is_dir():
        return set()
    return {p.name for p in cache.iterdir() if p.is_dir() and _ENTRY.match(p.name)}


def install_for(
    archive: str | os.PathLike[str], device, sha256: str | None = None
) -> Installed | None:
    """Install a tuned profile's archive for an engine on ``device`` into this process's Triton
    cache, with one log line either way; None when nothing was installed."""
    target = target_of(device)
    if target is None:
        log.info("kernel cache %s: not installed, this engine compiles no GPU kernels (%s)",
                 archive, getattr(device, "type", device))  # fmt: skip
        return None
    identity = identity_for(target)
    if identity is None:
        log.warning("kernel cache %s: not installed, Triton is not importable", archive)
        return None
    cache = triton_cache_dir()
    done = install(archive, cache, identity, sha256)
    if done is not None:
        log.info("kernel cache: %s into %s in %.2f s", done.describe(), cache, done.seconds)
    return done


@contextmanager
def installed_for_warm_up(shipped: tuple[Path, str | None] | None, device) -> Iterator[None]:
    """Around the engine's build and warm-up: install the profile's archive (``shipped``:
    its path and recorded digest, or None) first, and afterwards log how many cache entries the
    warm-up still had to compile (0 when the profile shipped every kernel it reached)."""
    if shipped is None or install_for(shipped[0], device, shipped[1]) is None:
        yield
        return
    cache = triton_cache_dir()
    before = cached_entries(cache)
    yield
    log.info("kernel cache: the engine's start compiled %d Triton cache entries the profile did not ship",
             len(cached_entries(cache) - before))  # fmt: skip
