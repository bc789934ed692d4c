"""`pagoda download`: fetch a model (or a PEFT LoRA adapter) into the download directory ahead of
serving.

    pagoda download --model hf://Qwen/Qwen3-0.6B --download-dir /models
    pagoda download --model s3://models/llama-3.2-1b --download-dir /models --download-size-limit 20Gi

The operator's `model-download` init container runs this; the serving container then finds the
copy with `HF_HUB_OFFLINE=1`. Prints the local path on stdout. A failure exits 2 with one line
on stderr and in the termination-message file (`ModelDownloadFailed/NotFound: ...`,
runtime/termination.py). Torch is never imported.
"""

from __future__ import annotations

import argparse
import logging

from pagoda.runtime.model.sources import cache, errors
from pagoda.runtime.model.sources.errors import DownloadError
from pagoda.runtime.model.sources.uri import is_remote
from pagoda.runtime.options import parse_size
from pagoda.runtime.termination import ReasonedError, exit_error

PROG = "pagoda download"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        metavar="URI",
        help="hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX",
    )
    p.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="with an hf:// model: the commit (or branch, tag) to fetch instead of the URI's "
        "revision (the operator's init container pins an hf:// model to a commit this way)",
    )
    p.add_argument(
        "--download-dir",
        default=None,
        metavar="DIR",
        help=f"cache directory (default: ${cache.DOWNLOAD_DIR_ENV} or ~/.cache/pagoda/models)",
    )
    p.add_argument(
        "--download-size-limit",
        default=None,
        metavar="SIZE",
        help="the most the download directory may hold in all, e.g. 20Gi (an emptyDir's "
        "sizeLimit): a model that would not fit is refused before downloading",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="after the download, remove the repo's other snapshots (hf://) from the download "
        "directory, but for those a running process reads (the operator's "
        "spec.modelCache.prune)",
    )
    p.add_argument("--log-level", default="info", choices=("error", "warning", "info", "debug"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from pagoda.runtime.model.sources.fetch import resolve_model

    try:
        if not is_remote(args.model):
            raise ReasonedError(
                f"--model {args.model!r}: expected hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX",
                reason="InvalidModel",
            )
        limit = None
        if args.download_size_limit is not None:
            try:
                limit = parse_size(args.download_size_limit)
            except ValueError:
                raise ReasonedError(
                    f"--download-size-limit {args.download_size_limit!r}: expected bytes or a "
                    "size such as 512Mi or 20Gi"
                ) from None
        path = resolve_model(
            args.model,
            args.download_dir,
            size_limit=limit,
            revision=args.revision,
            prune=args.prune,
        )
    except DownloadError as e:
        if e.detail == errors.NOT_CACHED:  # its advice is to run this command: say why it can't
            e = DownloadError(
                e.detail, f"{args.model}: not in the download directory, and "
                f"{cache.OFFLINE_ENV}=1 is set in this environment: unset it to download"
            )  # fmt: skip
        return exit_error(PROG, e)
    except ValueError as e:  # ReasonedError too
        return exit_error(PROG, e)
    print(path)
    return 0
