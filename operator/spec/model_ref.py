"""Where an InferenceService's weights come from: `spec.model` parsed into a :class:`ModelRef`.

A built-in name (carried by the runtime image), `pvc://CLAIM/PATH` (mounted read-only) or an
absolute path inside the image; anything that would make the runtime download weights is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pagoda.operator.spec.fields import SpecError, show
from pagoda.runtime.options import BUILTIN_MODELS  # what the runtime image carries itself

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


@dataclass(frozen=True)
class ModelRef:
    """Where the weights come from: `builtin`, `pvc` (mounted read-only) or `image` (a path in it)."""

    source: str
    uri: str
    claim: str | None = None
    subpath: str = ""

    MOUNT_ROOT = "/mnt/models"

    def __post_init__(self) -> None:
        if self.source not in ("builtin", "pvc", "image"):
            raise SpecError("InvalidModel", f"unknown model source {show(self.source)}")
        if self.source == "pvc" and not self.claim:
            raise SpecError("InvalidModel", f"{show(self.uri)}: a pvc:// model needs a claim name")

    @property
    def server_arg(self) -> str:
        """The value of `pagoda serve --model`."""
        if self.source == "builtin":
            return self.uri
        if self.source == "pvc":
            return f"{self.MOUNT_ROOT}/{self.subpath}" if self.subpath else self.MOUNT_ROOT
        return self.subpath

    def add_volume(self, volumes: list[dict], mounts: list[dict]) -> None:
        """Mount a `pvc://` model read-only at MOUNT_ROOT (nothing for other sources)."""
        if self.source != "pvc":
            return
        claim = {"claimName": self.claim, "readOnly": True}
        volumes.append({"name": "model", "persistentVolumeClaim": claim})
        mounts.append({"name": "model", "mountPath": self.MOUNT_ROOT, "readOnly": True})

    @classmethod
    def parse(cls, uri: str) -> ModelRef:
        if uri in BUILTIN_MODELS:
            return cls("builtin", uri)
        if uri.startswith("pvc://"):
            claim, _, sub = uri[len("pvc://") :].partition("/")
            if not claim or len(claim) > 253 or not _DNS1123_SUBDOMAIN.match(claim):
                raise SpecError(
                    "InvalidModel",
                    f"{show(uri)}: expected pvc://CLAIM/PATH with a valid claim name",
                )
            return cls("pvc", uri, claim=claim, subpath=_clean_path(uri, sub))
        if uri.startswith("file://"):
            uri_path = uri[len("file://") :]
            if not uri_path.startswith("/"):
                raise SpecError("InvalidModel", f"{show(uri)}: expected file:///ABSOLUTE/PATH")
            return cls("image", uri, subpath="/" + _clean_path(uri, uri_path))
        if uri.startswith("/"):
            return cls("image", uri, subpath="/" + _clean_path(uri, uri))
        if "://" in uri:
            scheme = uri.split("://", 1)[0]
            raise SpecError(
                "UnsupportedModelURI",
                f"{show(uri)}: scheme {scheme[:32]}:// is not supported; the runtime never downloads weights. "
                "Use a built-in name, pvc://CLAIM/PATH or an absolute path inside the image",
            )
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise SpecError(
            "UnknownModel",
            f"unknown built-in model {show(uri)} (built-in: {known}); "
            "for other weights use pvc://CLAIM/PATH or an absolute path inside the image",
        )


def _clean_path(uri: str, path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise SpecError("InvalidModel", f"{show(uri)}: '..' is not allowed in model paths")
    return "/".join(parts)
