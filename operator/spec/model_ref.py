"""Where an InferenceService's weights come from: `spec.model` parsed into a :class:`ModelRef`,
and the LoRA adapters served beside it (`spec.adapters`, with `spec.engine.lora`'s limits).

A built-in name (carried by the runtime image), `pvc://CLAIM/PATH` (mounted read-only), an
absolute path inside the image, or `hf://ORG/NAME[@REVISION]` / `s3://BUCKET/PREFIX`, which a
`model-download` init container fetches into the model cache (children/model_cache.py). The URI
grammar is the runtime's (pagoda.runtime.model.sources.uri).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pagoda.operator.spec.fields import SpecError, closed_object, opt_int, show
from pagoda.runtime.model.sources.uri import SCHEMES, HfURI, is_remote, parse_uri
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
    def pinned_uri(self) -> str:
        """The URI with the pinned commit as its revision (`hf://ORG/NAME@COMMIT`), as is when
        not pinned: what an adapter's download fetches (the model's takes `--revision`)."""
        if self.commit is None:
            return self.uri
        ref = parse_uri(self.uri)
        return HfURI(ref.repo, self.commit).uri  # type: ignore[union-attr]

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


# --- LoRA adapters: `spec.adapters` and `spec.engine.lora` ------------------------------------
#
#     adapters:
#       - {name: sql, source: hf://org/llama-sql-lora}    # downloaded (hf://, s3://); a branch
#                                                         # is pinned (reconcile/model_pin.py)
#       - {name: chat, source: pvc://models/adapters/chat}         # on spec.model's claim
#     engine:
#       lora: {maxLoras: 2, maxLoraRank: 64}
#
# A request's `model` names an adapter (or the base model's served name), as with vLLM's
# `--lora-modules`: the Service and the route need nothing new. Each adapter is a PEFT directory
# whose source has spec.model's grammar less the built-in names: hf:// and s3:// ones are fetched
# by the `adapter-download` init container (children/model_cache.py), the others are read where
# they are, on spec.model's PersistentVolumeClaim (mounted read-only) or inside the image.
#
# Defaults (`pagoda serve` takes vLLM's flags and defaults: `--max-loras` 1, `--max-lora-rank` 16,
# `--max-cpu-loras` = max-loras): `maxLoras` is min(adapters, 4) rather than vLLM's 1, since with
# 1 a batch runs one adapter's requests at a time and every declared adapter is meant to be served
# (4 bounds the slots the runtime preallocates on the GPU); `maxCpuLoras` is max(adapters,
# maxLoras), so every declared adapter stays loaded in host memory instead of being read from disk
# again whenever it returns to the batch; `maxLoraRank` is vLLM's 16 (the runtime refuses an
# adapter whose rank is larger, at start).

MAX_ADAPTERS = 64
MAX_ADAPTER_NAME = 64
MAX_SOURCE = 1024
# vLLM's allowed --max-lora-rank values (its LoRAConfig.possible_max_ranks, less 1)
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORA_RANK = 16  # vLLM's
DEFAULT_MAX_LORAS_CAP = 4  # unset maxLoras: min(len(adapters), this)
MAX_LORAS = 64  # maxLoras and maxCpuLoras: at most
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a file name too (never . or ..)
LORA_KEYS = ("maxLoras", "maxLoraRank", "maxCpuLoras")
P = "spec.adapters"


@dataclass(frozen=True)
class Adapter:
    """One adapter: the `model` name requests use, and where its PEFT directory comes from."""

    name: str
    source: ModelRef

    @property
    def remote(self) -> bool:
        """Downloaded by the `adapter-download` init container (hf://, s3://)."""
        return self.source.remote


@dataclass(frozen=True)
class LoraSpec:
    """`spec.engine.lora` as given (None: the default, filled in by `effective`)."""

    max_loras: int | None = None
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if self.max_lora_rank not in LORA_RANKS:
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.lora.maxLoraRank must be one of {', '.join(map(str, LORA_RANKS))}, "
                f"got {self.max_lora_rank}",
            )
        lo, hi = self.max_loras, self.max_cpu_loras
        if lo is not None and hi is not None and hi < lo:
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.lora.maxCpuLoras ({hi}) must be >= maxLoras ({lo})",
            )

    def effective(self, adapters: int) -> tuple[int, int, int]:
        """(maxLoras, maxLoraRank, maxCpuLoras) for `adapters` declared adapters."""
        loras = self.max_loras or min(adapters, DEFAULT_MAX_LORAS_CAP)
        cpu = self.max_cpu_loras or max(adapters, loras)
        if cpu < loras:
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.lora.maxCpuLoras ({cpu}) must be >= maxLoras ({loras}, "
                f"min({adapters} adapters, {DEFAULT_MAX_LORAS_CAP}) when unset)",
            )
        return loras, self.max_lora_rank, cpu

    @classmethod
    def from_dict(cls, engine: Mapping[str, Any]) -> LoraSpec | None:
        p, value = "spec.engine.lora", closed_object(engine, "lora", "spec.engine", LORA_KEYS)
        if value is None:
            return None
        rank = value.get("maxLoraRank")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise SpecError("InvalidSpec", f"{p}.maxLoraRank must be an integer, got {show(rank)}")
        return cls(
            max_loras=opt_int(value, "maxLoras", p, 1, MAX_LORAS),
            max_lora_rank=DEFAULT_MAX_LORA_RANK if rank is None else rank,
            max_cpu_loras=opt_int(value, "maxCpuLoras", p, 1, MAX_LORAS),
        )


def parse_adapters(spec: Mapping[str, Any], model: ModelRef) -> tuple[Adapter, ...]:
    """`spec.adapters` → adapters in the given order; SpecError names the item and the rule."""
    value = spec.get("adapters")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, Mapping) for a in value):
        raise SpecError("InvalidSpec", f"{P} must be a list of objects")
    if len(value) > MAX_ADAPTERS:
        raise SpecError(
            "InvalidSpec", f"{P} has {len(value)} items (at most {MAX_ADAPTERS} adapters)"
        )
    out: list[Adapter] = []
    for i, item in enumerate(value):
        p = f"{P}[{i}]"
        unknown = sorted(str(k) for k in item if k not in ("name", "source"))
        if unknown:
            raise SpecError(
                "InvalidSpec", f"{p}: unknown field(s) {', '.join(unknown)} (known: name, source)"
            )
        name, source = item.get("name"), item.get("source")
        if not isinstance(name, str) or not name:
            raise SpecError("InvalidSpec", f"{p}.name is required (a string)")
        if len(name) > MAX_ADAPTER_NAME or not ADAPTER_NAME.match(name):
            raise SpecError(
                "InvalidSpec",
                f"{p}.name {show(name)} must be at most {MAX_ADAPTER_NAME} letters, digits, "
                "'.', '_' or '-', starting with a letter or digit (the `model` requests send)",
            )
        if not isinstance(source, str) or not source:
            raise SpecError("InvalidSpec", f"{p}.source is required (a string)")
        if len(source) > MAX_SOURCE:
            raise SpecError(
                "InvalidSpec", f"{p}.source must be at most {MAX_SOURCE} characters: {show(source)}"
            )
        out.append(Adapter(name, _source(source, model, p)))
    names = [a.name for a in out]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise SpecError("InvalidSpec", f"{P}: duplicate name(s) {', '.join(dup)}")
    return tuple(out)


def _source(uri: str, model: ModelRef, p: str) -> ModelRef:
    """An adapter's source: spec.model's grammar less built-in names; a pvc:// one must be on
    spec.model's claim (mounted at ModelRef.MOUNT_ROOT)."""
    try:
        ref = ModelRef.parse(uri)
    except SpecError as e:
        if e.reason != "UnknownModel":
            raise SpecError(e.reason, f"{p}.source: {e.message}") from None
        ref = None
    if ref is None or ref.source == "builtin":
        raise SpecError(
            "InvalidSpec",
            f"{p}.source {show(uri)}: expected hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX, "
            "pvc://CLAIM/PATH (spec.model's claim) or an absolute path inside the image",
        )
    _check_claim(ref, model, f"{p}.source", "adapter")
    return ref


def _check_claim(ref: ModelRef, model: ModelRef, field: str, what: str) -> None:
    """A pvc:// source must be on spec.model's claim (the one volume mounted for it)."""
    if ref.source == "pvc" and (model.source != "pvc" or ref.claim != model.claim):
        where = f"spec.model's claim {model.claim}" if model.source == "pvc" else "none here"
        raise SpecError(
            "InvalidSpec",
            f"{field} {show(ref.uri)}: a pvc:// {what} must be on spec.model's "
            f"PersistentVolumeClaim ({where}); use hf:// or s3:// for others",
        )


def check_served_names(adapters: Sequence[Adapter], base_names: Sequence[str]) -> None:
    """An adapter named like the base model would shadow it (or it the adapter): refused. The
    CRD's rule compares with what it can see: spec.servedModelName, else metadata.name, and
    spec.model (a built-in's served name); `base_names` are the same."""
    for i, a in enumerate(adapters):
        if a.name in base_names:
            raise SpecError(
                "InvalidSpec",
                f"{P}[{i}].name {show(a.name)} is the base model's served name "
                f"(spec.servedModelName, else the built-in name or metadata.name): "
                "requests could not tell them apart",
            )


def parse_draft(engine: Mapping[str, Any], model: ModelRef) -> ModelRef | None:
    """`spec.engine.speculative.model`, the draft model of method draftModel: spec.model's
    grammar (a built-in name, hf://, s3://, a path in the image), a pvc:// one on spec.model's
    claim (mounted once, at ModelRef.MOUNT_ROOT). None when absent; whether the method takes it
    is spec/engine.py's `_speculative`."""
    speculative = engine.get("speculative")
    uri = speculative.get("model") if isinstance(speculative, Mapping) else None
    if uri is None:
        return None
    p = "spec.engine.speculative.model"
    if not isinstance(uri, str) or not uri:
        raise SpecError("InvalidSpec", f"{p} must be a non-empty string, got {show(uri)}")
    if len(uri) > MAX_SOURCE:
        raise SpecError("InvalidSpec", f"{p} must be at most {MAX_SOURCE} characters: {show(uri)}")
    try:
        ref = ModelRef.parse(uri)
    except SpecError as e:
        raise SpecError(e.reason, f"{p}: {e.message}") from None
    _check_claim(ref, model, p, "draft model")
    return ref
