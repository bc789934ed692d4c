"""The InferenceService spec as frozen dataclasses: parsed, defaulted and checked.

The CRD's OpenAPI schema (crds/inferenceservice.yaml) is the first line of defence; this module
is the second, so the operator behaves the same on an API server that applies the schema and on
one that does not (an emulator, or a CR written before a schema change). Defaults here must equal
the CRD's defaults (a test compares them). Every problem raises :class:`SpecError` with a
CamelCase reason that ends up in the `Degraded` condition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GROUP = "serving.pagoda.dev"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"

# Models the runtime image carries itself (`pagoda serve --model NAME`).
BUILTIN_MODELS: Mapping[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, Q4_1 GGUF shipped inside the runtime image (CPU friendly)",
}
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
BLOCK_SIZES = (8, 16, 32, 64, 128)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_NAME_LENGTH = 52  # leaves room for the "-config" suffix and pod-name hashes

# Defaults shared with the CRD schema (test_operator_crd.py checks they agree).
DEFAULT_REPLICAS = 1
DEFAULT_STARTUP_TIMEOUT_S = 1800
DEFAULT_DRAIN_TIMEOUT_S = 30
DEFAULT_API_KEY_KEY = "api-key"
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUANTITY = re.compile(
    r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)))?$"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


class SpecError(Exception):
    """An InferenceService that cannot be served as written: `reason` is CamelCase, `message` is for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# --- small typed readers over the raw spec dict --------------------------------------------


def _opt_int(d: Mapping[str, Any], key: str, path: str, lo: int, hi: int) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError("InvalidSpec", f"{path}.{key} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError("InvalidSpec", f"{path}.{key} must be between {lo} and {hi}, got {value}")
    return value


def _int(d: Mapping[str, Any], key: str, path: str, lo: int, hi: int, default: int) -> int:
    value = _opt_int(d, key, path, lo, hi)
    return default if value is None else value


def _opt_number(d: Mapping[str, Any], key: str, path: str, lo: float) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError("InvalidSpec", f"{path}.{key} must be a number, got {value!r}")
    if value < lo:
        raise SpecError("InvalidSpec", f"{path}.{key} must be at least {lo}, got {value}")
    return float(value)


def _bool(d: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise SpecError("InvalidSpec", f"{path}.{key} must be true or false, got {value!r}")
    return value


def _opt_str(d: Mapping[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError("InvalidSpec", f"{path}.{key} must be a non-empty string, got {value!r}")
    return value


def _choice(d: Mapping[str, Any], key: str, path: str, choices: Sequence[Any], default: Any) -> Any:
    value = d.get(key, default)
    if value not in choices:
        allowed = ", ".join(str(c) for c in choices)
        raise SpecError("InvalidSpec", f"{path}.{key} must be one of {allowed}; got {value!r}")
    return value


def _mapping(d: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = d.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError("InvalidSpec", f"{path}.{key} must be an object, got {value!r}")
    return value


def _quantity(d: Mapping[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(
            "InvalidSpec", f"{path}.{key} must be a quantity such as 4 or 16Gi, got {value!r}"
        )
    text = str(value)
    if not _QUANTITY.match(text):
        raise SpecError(
            "InvalidSpec", f"{path}.{key} is not a valid non-negative quantity: {value!r}"
        )
    return text


# --- the spec ---------------------------------------------------------------------------------


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
            raise SpecError("InvalidModel", f"unknown model source {self.source!r}")
        if self.source == "pvc" and not self.claim:
            raise SpecError("InvalidModel", f"{self.uri!r}: a pvc:// model needs a claim name")

    @property
    def server_arg(self) -> str:
        """The value of `pagoda serve --model`."""
        if self.source == "builtin":
            return self.uri
        if self.source == "pvc":
            return f"{self.MOUNT_ROOT}/{self.subpath}" if self.subpath else self.MOUNT_ROOT
        return self.subpath

    @classmethod
    def parse(cls, uri: str) -> ModelRef:
        if uri in BUILTIN_MODELS:
            return cls("builtin", uri)
        if uri.startswith("pvc://"):
            claim, _, sub = uri[len("pvc://") :].partition("/")
            if not claim or len(claim) > 253 or not _DNS1123_SUBDOMAIN.match(claim):
                raise SpecError(
                    "InvalidModel", f"{uri!r}: expected pvc://CLAIM/PATH with a valid claim name"
                )
            return cls("pvc", uri, claim=claim, subpath=_clean_path(uri, sub))
        if uri.startswith("file://"):
            uri_path = uri[len("file://") :]
            if not uri_path.startswith("/"):
                raise SpecError("InvalidModel", f"{uri!r}: expected file:///ABSOLUTE/PATH")
            return cls("image", uri, subpath="/" + _clean_path(uri, uri_path))
        if uri.startswith("/"):
            return cls("image", uri, subpath="/" + _clean_path(uri, uri))
        if "://" in uri:
            scheme = uri.split("://", 1)[0]
            raise SpecError(
                "UnsupportedModelURI",
                f"{uri!r}: scheme {scheme}:// is not supported; the runtime never downloads weights. "
                "Use a built-in name, pvc://CLAIM/PATH or an absolute path inside the image",
            )
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise SpecError(
            "UnknownModel",
            f"unknown built-in model {uri!r} (built-in: {known}); "
            "for other weights use pvc://CLAIM/PATH or an absolute path inside the image",
        )


def _clean_path(uri: str, path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise SpecError("InvalidModel", f"{uri!r}: '..' is not allowed in model paths")
    return "/".join(parts)


@dataclass(frozen=True)
class ResourcesSpec:
    gpus: int = 0
    cpu: str = DEFAULT_CPU
    memory: str = DEFAULT_MEMORY
    cpu_limit: str | None = None
    memory_limit: str | None = None  # None: equal to the memory request

    def __post_init__(self) -> None:
        if not 0 <= self.gpus <= 16:
            raise SpecError(
                "InvalidSpec", f"spec.resources.gpus must be between 0 and 16, got {self.gpus}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResourcesSpec:
        p = "spec.resources"
        return cls(
            gpus=_int(d, "gpus", p, 0, 16, 0),
            cpu=_quantity(d, "cpu", p) or DEFAULT_CPU,
            memory=_quantity(d, "memory", p) or DEFAULT_MEMORY,
            cpu_limit=_quantity(d, "cpuLimit", p),
            memory_limit=_quantity(d, "memoryLimit", p),
        )


@dataclass(frozen=True)
class EngineSpec:
    """Flags of `pagoda serve`; None means "the runtime's own default"."""

    dtype: str = "auto"
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    attention_backend: str = "auto"
    block_size: int = 16
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_queue_len: int | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError("InvalidSpec", f"spec.engine.dtype must be one of {', '.join(DTYPES)}")
        if self.block_size not in BLOCK_SIZES:
            raise SpecError("InvalidSpec", f"spec.engine.blockSize must be one of {BLOCK_SIZES}")
        if (
            self.max_num_seqs is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.maxNumBatchedTokens ({self.max_num_batched_tokens}) must be >= "
                f"maxNumSeqs ({self.max_num_seqs})",
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineSpec:
        p = "spec.engine"
        extra = d.get("extraArgs") or []
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise SpecError("InvalidSpec", f"{p}.extraArgs must be a list of strings")
        return cls(
            dtype=_choice(d, "dtype", p, DTYPES, "auto"),
            enable_prefix_caching=_bool(d, "enablePrefixCaching", p, True),
            enable_chunked_prefill=_bool(d, "enableChunkedPrefill", p, True),
            attention_backend=_choice(d, "attentionBackend", p, ATTENTION_BACKENDS, "auto"),
            block_size=_choice(d, "blockSize", p, BLOCK_SIZES, 16),
            max_num_seqs=_opt_int(d, "maxNumSeqs", p, 1, 4096),
            max_num_batched_tokens=_opt_int(d, "maxNumBatchedTokens", p, 1, 1 << 20),
            max_model_len=_opt_int(d, "maxModelLen", p, 1, 1 << 20),
            max_queue_len=_opt_int(d, "maxQueueLen", p, 0, 1 << 20),
            extra_args=tuple(extra),
        )

    def server_args(self) -> list[str]:
        """`pagoda serve` flags for this engine configuration (model/host/port excluded)."""
        args = ["--dtype", self.dtype, "--block-size", str(self.block_size)]
        args.append(
            "--enable-prefix-caching"
            if self.enable_prefix_caching
            else "--no-enable-prefix-caching"
        )
        args.append(
            "--enable-chunked-prefill"
            if self.enable_chunked_prefill
            else "--no-enable-chunked-prefill"
        )
        args += ["--attention-backend", self.attention_backend]
        for flag, value in (
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
            ("--max-model-len", self.max_model_len),
            ("--max-queue-len", self.max_queue_len),
        ):
            if value is not None:
                args += [flag, str(value)]
        return [*args, *self.extra_args]


@dataclass(frozen=True)
class AutoscalingSpec:
    max_replicas: int
    min_replicas: int = 1
    target_ttft_seconds: float | None = None
    target_queue_depth: float | None = None
    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int = 300

    def __post_init__(self) -> None:
        if self.min_replicas > self.max_replicas:
            raise SpecError(
                "InvalidSpec",
                f"spec.autoscaling.minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})",
            )
        if self.target_ttft_seconds is None and self.target_queue_depth is None:
            raise SpecError(
                "InvalidSpec", "spec.autoscaling needs targetTTFTSeconds or targetQueueDepth"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AutoscalingSpec:
        p = "spec.autoscaling"
        max_replicas = _opt_int(d, "maxReplicas", p, 1, 100)
        if max_replicas is None:
            raise SpecError("InvalidSpec", f"{p}.maxReplicas is required")
        return cls(
            max_replicas=max_replicas,
            min_replicas=_int(d, "minReplicas", p, 1, 100, 1),
            target_ttft_seconds=_opt_number(d, "targetTTFTSeconds", p, 0.001),
            target_queue_depth=_opt_number(d, "targetQueueDepth", p, 0.0),
            scale_up_stabilization_seconds=_int(d, "scaleUpStabilizationSeconds", p, 0, 3600, 0),
            scale_down_stabilization_seconds=_int(
                d, "scaleDownStabilizationSeconds", p, 0, 3600, 300
            ),
        )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = DEFAULT_API_KEY_KEY


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelRef
    served_model_name: str
    image: str
    image_pull_policy: str = "IfNotPresent"
    replicas: int = DEFAULT_REPLICAS
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    autoscaling: AutoscalingSpec | None = None
    api_key_secret: SecretKeyRef | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    startup_timeout_seconds: int = DEFAULT_STARTUP_TIMEOUT_S
    drain_timeout_seconds: int = DEFAULT_DRAIN_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.image_pull_policy not in PULL_POLICIES:
            raise SpecError(
                "InvalidSpec", f"spec.imagePullPolicy must be one of {', '.join(PULL_POLICIES)}"
            )
        names = [e.get("name") for e in self.env]
        if len(set(names)) != len(names):
            raise SpecError("InvalidSpec", "spec.env has duplicate names")
        if self.api_key_secret is not None and "PAGODA_API_KEY" in names:
            raise SpecError(
                "InvalidSpec",
                "spec.env sets PAGODA_API_KEY and spec.apiKeySecretRef is set too; keep one",
            )

    @property
    def min_replicas(self) -> int:
        """The fewest replicas the service may run with (decides whether a PDB makes sense)."""
        return self.autoscaling.min_replicas if self.autoscaling else self.replicas

    def desired_replicas(self, current: int | None) -> int:
        """Deployment replicas: `spec.replicas` decides, unless an autoscaler owns the number.

        With `spec.autoscaling` the autoscaler writes the Deployment's replicas; the reconciler
        keeps that value (`current`) and only clamps it into [minReplicas, maxReplicas].
        """
        if self.autoscaling is None:
            return self.replicas
        return self.autoscaling.clamp(self.autoscaling.min_replicas if current is None else current)

    @classmethod
    def from_dict(
        cls, spec: Mapping[str, Any], *, name: str, default_image: str
    ) -> InferenceServiceSpec:
        if not isinstance(spec, Mapping):
            raise SpecError("InvalidSpec", "spec must be an object")
        if not _DNS1035.match(name) or len(name) > MAX_NAME_LENGTH:
            raise SpecError(
                "InvalidName",
                f"metadata.name {name!r} must be a DNS-1035 label (lowercase letters, digits, '-', "
                f"starting with a letter) of at most {MAX_NAME_LENGTH} characters",
            )
        model_uri = spec.get("model")
        if not isinstance(model_uri, str) or not model_uri:
            raise SpecError("InvalidSpec", "spec.model is required")
        model = ModelRef.parse(model_uri)
        served = _opt_str(spec, "servedModelName", "spec") or (
            model.uri if model.source == "builtin" else name
        )
        secret = spec.get("apiKeySecretRef")
        api_key_secret = None
        if secret is not None:
            if not isinstance(secret, Mapping) or not _opt_str(
                secret, "name", "spec.apiKeySecretRef"
            ):
                raise SpecError("InvalidSpec", "spec.apiKeySecretRef.name is required")
            api_key_secret = SecretKeyRef(
                secret["name"],
                _opt_str(secret, "key", "spec.apiKeySecretRef") or DEFAULT_API_KEY_KEY,
            )
        node_selector = _mapping(spec, "nodeSelector", "spec")
        if not all(isinstance(v, str) for v in node_selector.values()):
            raise SpecError("InvalidSpec", "spec.nodeSelector values must be strings")
        autoscaling = spec.get("autoscaling")
        return cls(
            model=model,
            served_model_name=served,
            image=_opt_str(spec, "image", "spec") or default_image,
            image_pull_policy=_choice(
                spec, "imagePullPolicy", "spec", PULL_POLICIES, "IfNotPresent"
            ),
            replicas=_int(spec, "replicas", "spec", 0, 100, DEFAULT_REPLICAS),
            resources=ResourcesSpec.from_dict(_mapping(spec, "resources", "spec")),
            engine=EngineSpec.from_dict(_mapping(spec, "engine", "spec")),
            autoscaling=AutoscalingSpec.from_dict(autoscaling)
            if isinstance(autoscaling, Mapping)
            else None,
            api_key_secret=api_key_secret,
            node_selector=tuple(sorted(node_selector.items())),
            tolerations=tuple(_list_of_objects(spec, "tolerations")),
            env=tuple(_env(spec)),
            startup_timeout_seconds=_int(
                spec, "startupTimeoutSeconds", "spec", 30, 14400, DEFAULT_STARTUP_TIMEOUT_S
            ),
            drain_timeout_seconds=_int(
                spec, "drainTimeoutSeconds", "spec", 0, 3600, DEFAULT_DRAIN_TIMEOUT_S
            ),
        )


def _list_of_objects(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = spec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError("InvalidSpec", f"spec.{key} must be a list of objects")
    return value


def _env(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    env = _list_of_objects(spec, "env")
    for item in env:
        name = item.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise SpecError("InvalidSpec", f"spec.env: invalid variable name {name!r}")
    return env
