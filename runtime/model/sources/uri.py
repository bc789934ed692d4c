"""Model URIs that name weights kept elsewhere: `hf://ORG/NAME[@REVISION]` and `s3://BUCKET/PREFIX`.

The grammar, stated once (a contract with the operator, which validates `spec.model` with
`parse_uri`). Stdlib only: the operator image imports this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HF_SCHEME = "hf://"
S3_SCHEME = "s3://"
SCHEMES = (HF_SCHEME, S3_SCHEME)

# The Hub's repo ids: NAMESPACE/NAME, letters, digits, '-', '_', '.', at most 96 characters each.
_HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HF_REPO = re.compile(rf"^{_HF_PART}/{_HF_PART}$")
# A branch, tag or commit: git ref characters, no '..', no spaces.
COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a git commit: an immutable revision
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
# S3 bucket names (3-63 lowercase letters, digits, '.', '-'), as the S3 docs define them.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class HfURI:
    """`hf://ORG/NAME[@REVISION]`: a model repo on the Hugging Face Hub (or HF_ENDPOINT)."""

    repo: str
    revision: str | None = None  # None: the repo's default branch ("main")

    @property
    def uri(self) -> str:
        return f"{HF_SCHEME}{self.repo}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class S3URI:
    """`s3://BUCKET/PREFIX`: every object under PREFIX/ (the model's files) in an S3 bucket."""

    bucket: str
    prefix: str = ""  # without leading or trailing '/'; "" is the whole bucket

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")


ModelURI = HfURI | S3URI


def is_remote(model: str) -> bool:
    """Whether `--model` names weights to download (`hf://`, `s3://`)."""
    return isinstance(model, str) and model.startswith(SCHEMES)


def parse_uri(uri: str) -> ModelURI:
    """`hf://` / `s3://` URI → HfURI / S3URI; ValueError says what is wrong with it."""
    if uri.startswith(HF_SCHEME):
        rest = uri[len(HF_SCHEME) :]
        repo, at, revision = rest.partition("@")
        if not _HF_REPO.match(repo) or ".." in repo:
            raise ValueError(
                f"{uri!r}: expected hf://ORG/NAME[@REVISION] with a Hugging Face repo id "
                "(letters, digits, '-', '_', '.')"
            )
        if at and (not _REVISION.match(revision) or ".." in revision):
            raise ValueError(f"{uri!r}: invalid revision {revision!r} (a branch, tag or commit)")
        return HfURI(repo, revision or None)
    if uri.startswith(S3_SCHEME):
        bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise ValueError(f"{uri!r}: expected s3://BUCKET/PREFIX with a valid bucket name")
        parts = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"{uri!r}: '.' and '..' are not allowed in the prefix")
        return S3URI(bucket, "/".join(parts))
    raise ValueError(f"{uri!r} is not an hf:// or s3:// URI")
