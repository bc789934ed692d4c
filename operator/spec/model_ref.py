"""Where an InferenceService's weights come from: `spec.model` parsed into a :class:`ModelRef`.

A built-in name (carried by the runtime image), `pvc://CLAIM/PATH` (mounted read-only), an
absolute path inside the image, or `hf://ORG/NAME[@REVISION]` / `s3://BUCKET/PREFIX`, which a
`model-download` init container fetches into the model cache (children/model_cache.py). The URI
grammar is the runtime's (pagoda.runtime.model.sources.uri).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pagoda.operator.spec.fields import SpecError, show
from pagoda.runtime.model.sources.uri import SCHEMES, is_remote, parse_uri
from pagoda.runtime.options import BUILTIN_MODELS  # what the runtime image carries itself

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


@dataclass(frozen=True)
class ModelRef:
    """Where the weights come from: `builtin`, `pvc` (mounted read-only), `image` (a path in it),
    or `hf` / `s3` (downloaded by an init container)."""

    source: str
    uri: str
    claim: str | None = None
    subpath: str = ""
    # an hf:// model's branch or tag pinned to this commit by the operator (reconcile/model_pin.py):
    # the pods get `--revision COMMIT`
    commit: str | None = None

    MOUNT_ROOT = "/mnt/models"

    def __post_init__(self) -> None:
        if self.source not in ("builtin", "pvc", "image", "hf", "s3"):
            raise SpecError("InvalidModel", f"unknown model source {show(self.source)}")
        if self.commit is not None and self.source != "hf":
            raise SpecError("InvalidModel", f"{show(self.uri)}: only an hf:// model has commits")
        if self.source == "pvc" and not self.claim:
            raise SpecError("InvalidModel", f"{show(self.uri)}: a pvc:// model needs a claim name")

    @property
    def remote(self) -> bool:
        """Downloaded into the model cache (hf://, s3://) rather than carried or mounted."""
        return self.source in ("hf", "s3")

    @property
    def gguf(self) -> bool:
        """A GGUF file (a built-in model's, or a path ending in .gguf): weights with their own
        quantization, which ``--quantization fp8`` refuses."""
        if self.source == "builtin":
            return BUILTIN_MODELS[self.uri].filename.endswith(".gguf")
        return self.uri.rstrip("/").endswith(".gguf")

    @property
    def server_arg(self) -> str:
        """The value of `pagoda serve --model` (a remote URI as is, with `--download-dir`)."""
        if self.source == "builtin" or self.remote:
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
        if is_remote(uri):
            try:
                parsed = parse_uri(uri)
            except ValueError as e:
                raise SpecError("InvalidModel", str(e)) from e
            return cls(uri[: uri.index("://")], parsed.uri)
        if "://" in uri:
            scheme = uri.split("://", 1)[0]
            raise SpecError(
                "UnsupportedModelURI",
                f"{show(uri)}: scheme {scheme[:32]}:// is not supported. Use a built-in name, "
                f"{', '.join(s + '...' for s in SCHEMES)}, pvc://CLAIM/PATH or an absolute path "
                "inside the image",
            )
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise SpecError(
            "UnknownModel",
            f"unknown built-in model {show(uri)} (built-in: {known}); "
            "for other weights use hf://ORG/NAME, s3://BUCKET/PREFIX, pvc://CLAIM/PATH or an "
            "absolute path inside the image",
        )


def _clean_path(uri: str, path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise SpecError("InvalidModel", f"{show(uri)}: '..' is not allowed in model paths")
    return "/".join(parts)
