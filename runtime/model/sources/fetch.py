"""`--model hf://…` / `s3://…` → a local path the loaders read: from the download directory's
cache when a complete copy is there, else downloaded (docs/runtime.md, "Model sources").

* online: hf:// asks the Hub which commit the revision is now (one request) and fetches only
  missing files; a commit-hash revision already complete in the cache needs no request at all;
  s3:// lists the prefix and fetches only new or changed objects. An unreachable endpoint falls
  back to a complete cached copy, with a warning. Processes sharing the directory download one
  at a time (`cache.download_lock`); the next finds the files there.
* offline (`HF_HUB_OFFLINE=1`, what the operator sets in the serving container): only the cache;
  a model not (completely) in it is a `NotCached` failure.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pagoda.runtime.model.sources import cache, errors
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.uri import COMMIT, HfURI, ModelURI, is_remote, parse_uri
from pagoda.runtime.termination import ReasonedError

log = logging.getLogger("pagoda.runtime.model.sources")


def with_revision(ref: ModelURI, revision: str) -> HfURI:
    """`ref` at `revision` (`--revision`); InvalidModel for an s3:// one or a bad revision."""
    if not isinstance(ref, HfURI):
        raise ReasonedError(
            f"--revision {revision!r}: only an hf:// model has revisions, not {ref.uri}",
            reason="InvalidModel",
        )
    try:
        return parse_uri(f"hf://{ref.repo}@{revision}")  # type: ignore[return-value]
    except ValueError as e:
        raise ReasonedError(f"--revision: {e}", reason="InvalidModel") from e


def resolve_model(
    model: str,
    download_dir: str | Path | None = None,
    *,
    offline: bool | None = None,
    size_limit: int | None = None,
    revision: str | None = None,
    prune: bool = False,
) -> str:
    """The local path of `model`; anything but an hf:// or s3:// URI is returned as is.

    `download_dir` None: `$PAGODA_DOWNLOAD_DIR` or ~/.cache/pagoda/models; `offline` None: from
    `HF_HUB_OFFLINE`; `size_limit`: bytes the download dir may hold in all (an emptyDir's
    sizeLimit); `revision`: an hf:// model's commit (or branch, tag) in place of the URI's
    (`--revision`: the operator's pin); `prune`: then remove the repo's other snapshots that no
    process holds (prune.py). An hf:// snapshot returned is held (in use) until the process
    exits. Raises DownloadError (a ValueError) with one line saying what failed.
    """
    if not is_remote(model):
        if revision:  # a local path or built-in name has no revisions to choose from
            raise ReasonedError(
                f"--revision {revision!r}: only an hf:// model has revisions, not {model!r}",
                reason="InvalidModel",
            )
        return model
    try:
        ref = parse_uri(model)
    except ValueError as e:
        raise ReasonedError(str(e), reason="InvalidModel") from e
    if revision:
        ref = with_revision(ref, revision)
    root = Path(download_dir).expanduser() if download_dir else cache.default_download_dir()
    offline = cache.offline_from_env() if offline is None else offline
    path = _resolve(ref, root, offline, size_limit)
    if isinstance(ref, HfURI):
        from pagoda.runtime.model.sources import prune as pruning

        if prune and not offline and (snapshot := pruning.snapshot_of(path)) is not None:
            with cache.download_lock(root, ref) as held:
                if held:  # else another process's download may be linking blobs right now
                    pruning.prune(root, ref.repo, keep=snapshot[1])
        pruning.hold(root, path)
    return str(path)


def snapshot_commit(path: str | Path) -> str | None:
    """The commit of an hf:// snapshot `resolve_model` returned (`…/snapshots/COMMIT`); None for
    any other path (a local folder, a GGUF file, an s3:// copy)."""
    from pagoda.runtime.model.sources import prune as pruning

    found = pruning.snapshot_of(Path(path))
    return found[1] if found is not None and COMMIT.match(found[1]) else None


def _resolve(ref: ModelURI, root: Path, offline: bool, size_limit: int | None) -> Path:
    cached = cache.lookup(root, ref)
    if offline:
        if cached is None:
            raise DownloadError(
                errors.NOT_CACHED,
                f"{ref.uri}: no complete copy in the download directory {root}, and "
                f"{cache.OFFLINE_ENV}=1 forbids downloading (run `pagoda download --model "
                f"{ref.uri} --download-dir {root}` first)",
            )
        return cached
    immutable = isinstance(ref, HfURI) and bool(ref.revision and COMMIT.match(ref.revision))
    if cached is not None and immutable:
        return cached
    cache.ensure_dir(ref.uri, root)
    with cache.download_lock(root, ref) as held:  # pods sharing the directory: one at a time
        if immutable and (done := cache.lookup(root, ref)) is not None:
            return done  # another process completed it while this one waited
        try:
            if isinstance(ref, HfURI):
                from pagoda.runtime.model.sources import hub

                path, files, commit = hub.fetch(ref, root, size_limit=size_limit, exclusive=held)
            else:
                from pagoda.runtime.model.sources import s3

                path, files, commit = s3.fetch(ref, root, size_limit=size_limit, exclusive=held)
        except DownloadError as e:
            if e.detail == errors.UNREACHABLE and cached is not None:
                log.warning("%s; using the copy in the download directory: %s", e, cached)
                return cached
            raise
        if isinstance(ref, HfURI) and commit:
            from pagoda.runtime.model.sources import prune as pruning

            pruning.create_inuse(root, ref.repo, commit)  # before the manifest: readers find it
        cache.record(root, ref, path, files, commit)
    return Path(path)
