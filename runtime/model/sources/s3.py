"""`s3://BUCKET/PREFIX` with boto3: the checkpoint files under PREFIX/ into the download dir.

boto3 reads its usual settings from the environment: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`), `AWS_DEFAULT_REGION` or `AWS_REGION` (read
here: botocore does not), and `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) for S3-compatible
stores (MinIO, Ceph, R2, GCS's XML API). `PAGODA_S3_ADDRESSING_STYLE` (path | virtual | auto, default auto) picks the URL form;
S3-compatible stores usually want `path`. Without credentials the requests go unsigned
(public buckets).

PREFIX names a folder (with or without a trailing '/': the files the engine reads, ALLOW_PATTERNS
at its top level, of the weights only those the loader reads) or one `.gguf` object. Files
already present with the size and ETag they were downloaded with are kept, so a download cut
short resumes with the file it was on, from the last part that reached the disk (s3_parts: ranged
GETs with If-Match, so a changed object starts over).
"""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagoda.runtime.model.sources import cache, errors, s3_parts
from pagoda.runtime.model.sources.errors import DownloadError, from_os_error
from pagoda.runtime.model.sources.hub import (
    check_layout,
    is_network_error,
    log,
    quiet_http_logs,
    select_weights,
    wanted,
)
from pagoda.runtime.model.sources.progress import Progress
from pagoda.runtime.model.sources.uri import S3URI

ADDRESSING_STYLE_ENV = "PAGODA_S3_ADDRESSING_STYLE"
ETAGS_FILE = ".pagoda-etags"  # the etag of every file downloaded complete, beside them
PARTIAL = ".partial"  # a file being downloaded: `.NAME.partial-RANDOM`
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
           "ExpiredToken", "AllAccessDisabled", "AccountProblem", "403", "401"}  # fmt: skip
_MISSING = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}


def client() -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    style = os.environ.get(ADDRESSING_STYLE_ENV, "auto")
    if style not in ("auto", "path", "virtual"):
        raise DownloadError(
            errors.FAILED, f"{ADDRESSING_STYLE_ENV} must be auto, path or virtual, got {style!r}"
        )
    session = boto3.session.Session(**_keys_from_env())
    # botocore reads AWS_DEFAULT_REGION only; the other AWS SDKs (and EKS, ECS) set AWS_REGION
    region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")
    config = Config(
        s3={"addressing_style": style},
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        **({} if session.get_credentials() is not None else {"signature_version": UNSIGNED}),
    )
    return session.client("s3", config=config, region_name=region or session.region_name)


@dataclass
class Listing:
    """What is under the prefix: {relative path: (key, size, etag)} of the objects the engine
    reads, how many objects in all, the other top-level files, the subfolders with a config.json
    (a prefix one level too high)."""

    objects: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    seen: int = 0
    others: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


KEY_ENV = {"aws_access_key_id": "AWS_ACCESS_KEY_ID",
           "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
           "aws_session_token": "AWS_SESSION_TOKEN"}  # fmt: skip


def _keys_from_env() -> dict[str, str]:
    """The keys from the environment without the spaces and newline around them (a Secret made
    from a file keeps its newline: an invalid header, or a signature that never matches), as
    huggingface_hub reads HF_TOKEN; {} (boto3's own chain: profiles, web identity, instance
    roles) unless both keys are set and one of them needs it."""
    raw = {arg: os.environ.get(name) for arg, name in KEY_ENV.items()}
    if not (raw["aws_access_key_id"] and raw["aws_secret_access_key"]):
        return {}
    if all(v is None or v == v.strip() for v in raw.values()):
        return {}
    return {arg: v.strip() for arg, v in raw.items() if v and v.strip()}


def _list(s3: Any, ref: S3URI) -> Listing:
    found = Listing()
    folder = f"{ref.prefix}/" if ref.prefix else ""
    listed = ref.prefix if ref.prefix.endswith(".gguf") else folder  # not `PREFIX-other/...`
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=ref.bucket, Prefix=listed):
        for obj in page.get("Contents") or []:
            key, size, etag = obj["Key"], int(obj.get("Size") or 0), obj.get("ETag", "")
            if key == ref.prefix and key.endswith(".gguf"):
                return Listing({key.rpartition("/")[2]: (key, size, etag)}, 1)  # one GGUF file
            if not key.startswith(folder):
                continue
            found.seen += 1
            rel = key[len(folder) :]
            if wanted(rel):
                found.objects[rel] = (key, size, etag)
            elif "/" not in rel:
                found.others.append(rel)
            elif rel.endswith("/config.json"):
                found.models.append(rel.removesuffix("config.json"))
    return found


def _etags(local: Path) -> dict[str, str]:
    try:
        lines = (local / ETAGS_FILE).read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split("\t", 1) for line in lines if "\t" in line)


def fetch(
    ref: S3URI, root: Path, *, size_limit: int | None = None, exclusive: bool = True
) -> tuple[Path, dict[str, int], None]:
    """Download (or keep what is there) → (local path, {file: size}, None). `exclusive`: the
    caller holds the folder's download lock, so `.NAME.partial*` files there were left by a
    download cut short (removed); else they are left alone."""
    quiet_http_logs()
    s3 = None
    try:
        s3 = client()
        return _fetch(s3, ref, root, size_limit, exclusive)
    except DownloadError:
        raise
    except Exception as e:
        raise classify(ref, e, anonymous=s3 is not None and _unsigned(s3)) from e


def _unsigned(s3: Any) -> bool:
    from botocore import UNSIGNED

    return s3.meta.config.signature_version is UNSIGNED


def _fetch(
    s3: Any, ref: S3URI, root: Path, size_limit: int | None, exclusive: bool
) -> tuple[Path, dict[str, int], None]:
    found = _list(s3, ref)
    objects, seen = found.objects, found.seen
    where = f"s3://{ref.bucket}/{ref.prefix + '/' if ref.prefix else ''}"
    _check_found(ref, found, where)
    single = next(iter(objects)) if len(objects) == 1 and ref.prefix.endswith(".gguf") else None
    local = cache.s3_dir(root, ref.bucket, ref.prefix.rpartition("/")[0] if single else ref.prefix)
    if single is None:
        many = f"{seen} object{'' if seen == 1 else 's'}"
        check_layout(ref.uri, sorted(objects), f"{where} ({many})", found.others)
        sizes = select_weights(ref.uri, {r: o[1] for r, o in objects.items()},
                               lambda name: _read(s3, ref.bucket, objects[name][0]))  # fmt: skip
        objects = {rel: obj for rel, obj in objects.items() if rel in sizes}
    known = _etags(local)
    todo = {
        rel: obj
        for rel, obj in objects.items()
        if not ((local / rel).is_file() and (local / rel).stat().st_size == obj[1]
                and known.get(rel) == obj[2])
    }  # fmt: skip
    files = {rel: size for rel, (_, size, _) in objects.items()}
    path = local / single if single else local
    if not todo:
        log.info("%s: all %d files are in %s", ref.uri, len(files), local)
        return path, files, None
    if exclusive:  # of a download cut short (another's in progress without a lock)
        _remove_partials(local, objects, keep=todo)
    resumed = {rel: _resumable(local, rel, obj) if exclusive else 0 for rel, obj in todo.items()}
    needed = sum(o[1] for o in todo.values()) - sum(resumed.values())
    cache.check_space(ref.uri, root, needed, size_limit)
    local.mkdir(parents=True, exist_ok=True)
    cache.manifest_path(root, ref).unlink(missing_ok=True)  # files change: not complete now
    done = {rel: etag for rel, etag in known.items() if rel not in todo}  # (another .gguf's too)
    with Progress(ref.uri, needed, len(todo)) as progress:
        for rel, (key, size, etag) in sorted(todo.items()):
            if resumed[rel]:
                log.info("%s: resuming at %d of %d bytes (left by a download cut short)",
                         rel, resumed[rel], size)  # fmt: skip
            # with the lock, a name a download cut short finds again; without, this process's
            tmp = local / (f".{rel}{PARTIAL}" if exclusive else
                           f".{rel}{PARTIAL}-{uuid.uuid4().hex[:8]}")  # fmt: skip
            try:
                s3_parts.download(s3, ref.bucket, key, size, etag, tmp, progress.add)
                os.replace(tmp, local / rel)
            except BaseException:
                if not exclusive:
                    s3_parts.remove(tmp)
                raise
            s3_parts.remove(tmp)  # its journal
            done[rel] = etag  # recorded file by file: a download cut short keeps what it got
            _write_etags(local, done)
            progress.file_done()
    return path, files, None


def _check_found(ref: S3URI, found: Listing, where: str) -> None:
    """DownloadError NOT_FOUND for a prefix with no objects, or with no config.json where a
    folder below it holds a model (the likely mistake: name that folder)."""
    if not found.seen:
        raise DownloadError(
            errors.NOT_FOUND, f"{ref.uri}: no objects under {where} (empty or missing prefix)"
        )
    if "config.json" not in found.objects and found.models:
        below = sorted(found.models, key=lambda m: (m.count("/"), m))
        raise DownloadError(
            errors.NOT_FOUND,
            f"{ref.uri}: no config.json in {where}, but a model is in a folder below it: "
            + ", ".join(f"{where}{m}" for m in below[:3]) + (" ..." if len(below) > 3 else "")
            + " (name that prefix)",
        )  # fmt: skip


def _read(s3: Any, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def _write_etags(local: Path, etags: dict[str, str]) -> None:
    tmp = local / f"{ETAGS_FILE}{PARTIAL}-{uuid.uuid4().hex[:8]}"
    tmp.write_text("".join(f"{r}\t{e}\n" for r, e in sorted(etags.items())))
    os.replace(tmp, local / ETAGS_FILE)


def _resumable(local: Path, rel: str, obj: tuple[str, int, str]) -> int:
    """Bytes of `rel` a download cut short left that the next one keeps (s3_parts)."""
    _, size, etag = obj
    parts = s3_parts.done_parts(local / f".{rel}{PARTIAL}", etag, size, s3_parts.PART_BYTES)
    return sum(min(size, (i + 1) * s3_parts.PART_BYTES) - i * s3_parts.PART_BYTES for i in parts)


def _remove_partials(local: Path, names: Iterable[str], keep: Iterable[str] = ()) -> None:
    """What a download of these files cut short left (only theirs: another GGUF of the folder
    may be downloading), but for the files still to download (`keep`) the `.NAME.partial` and
    its journal that s3_parts resumes from: older `.NAME.partial-RANDOM` files and boto3's own
    `.NAME.partial-RANDOM.RANDOM`."""
    keep = set(keep)
    for name in names:
        stable = f".{name}{PARTIAL}"
        kept = {stable, stable + s3_parts.JOURNAL} if name in keep else set()
        for partial in local.glob(f"{glob.escape(stable)}*"):
            if partial.name not in kept:
                with contextlib.suppress(OSError):
                    partial.unlink()


def classify(ref: S3URI, error: Exception, *, anonymous: bool = False) -> DownloadError:
    """A boto3 (or I/O) failure → DownloadError with its class. `anonymous`: the requests went
    unsigned (no credentials found), so a refusal means credentials are missing."""
    from botocore import exceptions as bx

    uri = ref.uri
    if isinstance(error, bx.ClientError):
        err = error.response.get("Error") or {}
        code = str(err.get("Code") or "")
        status = (error.response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        text = f"{code or status}: {err.get('Message') or error}"
        if anonymous and code not in _MISSING and status != 404:
            return DownloadError(
                errors.UNAUTHORIZED,
                f"{uri}: no AWS credentials were found (AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY, e.g. from spec.modelSecretRef's Secret) and the "
                f"anonymous request was refused ({text})",
            )
        if code in _DENIED or status in (401, 403):
            return DownloadError(
                errors.UNAUTHORIZED,
                f"{uri}: access denied ({text}); check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY and the bucket's policy",
            )
        if code in _MISSING or status == 404:
            return DownloadError(errors.NOT_FOUND, f"{uri}: not found ({text})")
        return errors.for_status(uri, status, text)
    if isinstance(error, bx.NoCredentialsError | bx.PartialCredentialsError):
        return DownloadError(errors.UNAUTHORIZED, f"{uri}: {error}")
    if isinstance(error, bx.EndpointConnectionError | bx.ConnectTimeoutError) or (
        is_network_error(error)
    ):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return DownloadError(
            errors.UNREACHABLE,
            f"{uri}: cannot reach {endpoint or 'S3'}: {type(error).__name__}: {error}",
        )
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            return from_os_error(uri, cause)
        cause = cause.__cause__ or cause.__context__
    return DownloadError(errors.FAILED, f"{uri}: {type(error).__name__}: {error}")
