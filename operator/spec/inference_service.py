"""The InferenceService spec as frozen dataclasses: parsed, defaulted and checked. This module is
the top level (`InferenceServiceSpec`: the model, the image, `resources`, `modelCache` and the
checks across sections); the sections have their own modules: `spec.engine` and `spec.autotune`
in spec/engine.py, `spec.parallelism` and `spec.autoscaling` in spec/scaling.py, `spec.model`
and `spec.adapters` in spec/model_ref.py, the node selector, tolerations, env,
`engine.extraArgs` and the Secret references in spec/pod_fields.py.

The CRD's OpenAPI schema (crds/inferenceservice.yaml) is the first line of defence; this module
is the second, so the operator behaves the same on an API server that applies the schema and on
one that does not (an emulator, or a CR written before a schema change). Defaults here must equal
the CRD's defaults (a test compares them). Every problem raises :class:`SpecError` with a
CamelCase reason that ends up in the `Degraded` condition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator.kube.drift import parse_quantity
from pagoda.operator.kube.names import MAX_GROUP_NAME_LENGTH, PodIds
from pagoda.operator.spec import pod_fields
from pagoda.operator.spec.engine import (
    ATTENTION_BACKENDS,
    BLOCK_SIZES,
    DTYPES,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    AutotuneSpec,
    EngineSpec,
)
from pagoda.operator.spec.fields import (
    SpecError,
    bool_or,
    choice,
    int_or,
    mapping,
    opt_int,
    opt_str,
    quantity,
    show,
)
from pagoda.operator.spec.model_ref import (
    Adapter,
    LoraSpec,
    ModelRef,
    check_served_names,
    parse_adapters,
    parse_draft,
)
from pagoda.operator.spec.scaling import (
    DEFAULT_TOLERANCE,
    AutoscalingSpec,
    ParallelismSpec,
)
from pagoda.runtime import options

# The sections' names other modules and tests import from here (spec/engine.py, spec/scaling.py).
__all__ = [
    "ATTENTION_BACKENDS",
    "BLOCK_SIZES",
    "DEFAULT_TOLERANCE",
    "DTYPES",
    "KV_CACHE_DTYPES",
    "PULL_POLICIES",
    "QUANTIZATIONS",
    "AutoscalingSpec",
    "AutotuneSpec",
    "EngineSpec",
    "InferenceServiceSpec",
    "ModelCacheSpec",
    "ParallelismSpec",
    "ResourcesSpec",
    "SpecError",
]

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_NAME_LENGTH = 52  # leaves room for the "-config" suffix and pod-name hashes

# Defaults shared with the CRD schema (test_operator_crd.py checks they agree).
DEFAULT_REPLICAS = 1
DEFAULT_STARTUP_TIMEOUT_S = 1800
# How long an hf:// or s3:// model's download may take before the rollout counts as stalled
# (spec.modelCache.downloadDeadlineSeconds; added to the Deployment's progressDeadlineSeconds).
DEFAULT_DOWNLOAD_DEADLINE_S = 3600
DEFAULT_DRAIN_TIMEOUT_S = int(options.DEFAULT_DRAIN_TIMEOUT_S)  # the CRD's field is an integer
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE = re.compile(r"^\S+$")  # the API server refuses an image with whitespace
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
# The CRD's length and size limits, enforced here too (the schema may not be applied).
MAX_MODEL = 1024
MAX_SERVED_NAME = 256
MAX_IMAGE = 512
MAX_ENV_NAME = 256
MAX_TOLERATIONS = 32
MAX_ENV = 128


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
        # The API server refuses a pod whose request exceeds its limit (the CRD cannot compare
        # quantities in a way every supported Kubernetes evaluates).
        for request, limit, name in (
            (self.cpu, self.cpu_limit, "cpu"),
            (self.memory, self.memory_limit, "memory"),
        ):
            wanted, most = parse_quantity(request), parse_quantity(limit)
            if wanted is not None and most is not None and wanted > most:
                raise SpecError(
                    "InvalidSpec",
                    f"spec.resources.{name} ({request}) must be <= spec.resources.{name}Limit "
                    f"({limit})",
                )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResourcesSpec:
        p = "spec.resources"
        return cls(
            gpus=int_or(d, "gpus", p, 0, 16, 0),
            cpu=quantity(d, "cpu", p) or DEFAULT_CPU,
            memory=quantity(d, "memory", p) or DEFAULT_MEMORY,
            cpu_limit=quantity(d, "cpuLimit", p),
            memory_limit=quantity(d, "memoryLimit", p),
        )


@dataclass(frozen=True)
class ModelCacheSpec:
    """Where hf:// and s3:// models are downloaded: a PersistentVolumeClaim shared by the
    replicas (`claim_name`), else an emptyDir per pod, optionally capped at `size_limit`;
    `prune`: a claim keeps one snapshot of the repo (`pagoda download --prune`);
    `download_deadline_seconds`: how long a pod's download may take before its rollout counts as
    stalled (None: DEFAULT_DOWNLOAD_DEADLINE_S; the download itself is not stopped)."""

    claim_name: str | None = None
    size_limit: str | None = None  # a quantity; the emptyDir's sizeLimit
    prune: bool = False
    download_deadline_seconds: int | None = None

    def __post_init__(self) -> None:
        if self.claim_name and self.size_limit:
            raise SpecError(
                "InvalidSpec",
                "spec.modelCache: sizeLimit caps the default emptyDir; a claimName's size is the "
                "PersistentVolumeClaim's own: set one of them",
            )
        if self.prune and not self.claim_name:
            raise SpecError(
                "InvalidSpec",
                "spec.modelCache.prune removes old snapshots from a shared claim; the default "
                "emptyDir holds one pod's download only: set claimName too, or drop prune",
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelCacheSpec:
        p = "spec.modelCache"
        claim = opt_str(d, "claimName", p, max_len=pod_fields.MAX_SECRET_FIELD)
        if claim is not None and not pod_fields.DNS1123_SUBDOMAIN.match(claim):
            raise SpecError("InvalidSpec", f"{p}.claimName {show(claim)} is not a valid PVC name")
        limit = quantity(d, "sizeLimit", p)
        if limit is not None and not parse_quantity(limit):
            raise SpecError("InvalidSpec", f"{p}.sizeLimit must be more than 0")
        return cls(
            claim_name=claim,
            size_limit=limit,
            prune=bool_or(d, "prune", p, False),
            download_deadline_seconds=opt_int(d, "downloadDeadlineSeconds", p, 0, 86400),
        )

    @property
    def size_limit_bytes(self) -> int | None:
        return None if self.size_limit is None else int(parse_quantity(self.size_limit) or 0)

    @property
    def download_deadline(self) -> int:
        if self.download_deadline_seconds is None:
            return DEFAULT_DOWNLOAD_DEADLINE_S
        return self.download_deadline_seconds


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
    autotune: AutotuneSpec = field(default_factory=AutotuneSpec)
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    api_key_secret: pod_fields.SecretKeyRef | None = None
    model_cache: ModelCacheSpec = field(default_factory=ModelCacheSpec)
    model_secret: str | None = None  # a Secret whose keys the model-download container gets as env
    adapters: tuple[Adapter, ...] = ()  # LoRA adapters served beside the model (spec/model_ref.py)
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    startup_timeout_seconds: int = DEFAULT_STARTUP_TIMEOUT_S
    drain_timeout_seconds: int = DEFAULT_DRAIN_TIMEOUT_S
    # Not from the CR: the operator's --pod-run-as-user/-group/--pod-fs-group, as `image` falls
    # back to its --default-image; every pod built from this spec gets them.
    pod_ids: PodIds = field(default_factory=PodIds)

    def __post_init__(self) -> None:
        if self.image_pull_policy not in PULL_POLICIES:
            raise SpecError(
                "InvalidSpec", f"spec.imagePullPolicy must be one of {', '.join(PULL_POLICIES)}"
            )
        names = [e.get("name") for e in self.env]
        if len(set(names)) != len(names):
            raise SpecError("InvalidSpec", "spec.env has duplicate names")
        if self.api_key_secret is not None and options.API_KEY_ENV in names:
            raise SpecError(
                "InvalidSpec",
                f"spec.env sets {options.API_KEY_ENV} and spec.apiKeySecretRef is set too; keep one",
            )
        if self.engine.kv_cache_dtype == "int8" and (
            self.resources.gpus > 0 or self.engine.attention_backend == "triton"
        ):
            raise SpecError(
                "InvalidSpec",
                "spec.engine.kvCacheDtype int8 runs on CPU pods only (resources.gpus 0, "
                "attentionBackend auto or torch)",
            )
        fp8 = [n for n, on in (("kvCacheDtype fp8", self.engine.kv_cache_dtype == "fp8"),
                               ("quantization fp8", self.engine.quantization == "fp8")) if on]  # fmt: skip
        if fp8 and (self.resources.gpus < 1 or self.engine.attention_backend == "torch"):
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.{' and '.join(fp8)} runs on GPU pods only (resources.gpus >= 1 on "
                "GPUs with FP8: Ada, Hopper or later; attentionBackend auto or triton)",
            )
        if self.engine.quantization == "fp8" and self.model.gguf:
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.quantization fp8 quantizes 16/32-bit safetensors checkpoints; "
                f"spec.model {show(self.model.uri)} is a GGUF file (its own quantization): leave "
                "quantization unset",
            )
        if not self.downloads and (self.model_secret or self.model_cache != ModelCacheSpec()):
            raise SpecError(
                "InvalidSpec",
                "spec.modelCache and spec.modelSecretRef apply to hf:// and s3:// models only "
                "(and to hf:// and s3:// spec.adapters), draft models included",
            )
        if self.autotune.enabled and self.resources.gpus < 1:
            raise SpecError(
                "InvalidSpec", "spec.autotune.enabled tunes GPU nodes: set spec.resources.gpus >= 1"
            )
        self.parallelism.check(self.resources.gpus)
        if self.autotune.enabled and self.tensor_parallel_size > 1:
            raise SpecError(
                "InvalidSpec",
                "spec.autotune.enabled measures a server on one GPU; it cannot tune a "
                f"tensor-parallel one (tensor-parallel size {self.tensor_parallel_size})",
            )
        self._check_speculative()
        self._check_adapters()
        self._check_split()

    def _check_speculative(self) -> None:
        """What `pagoda serve --speculative-config` refuses at start (a crash loop), refused
        here (with adapters: `_check_adapters`). Tensor parallelism, multi-node too, is served
        with either method (rank 0 drafts: a draft model whole on it)."""
        e = self.engine
        if e.speculative is None:
            return
        if e.runner == "pooling":
            raise SpecError(
                "InvalidSpec",
                "spec.engine.speculative is not supported with the pooling runner (an embedding "
                "request generates nothing): drop one of them",
            )
        if e.draft is not None and e.quantization is not None:
            raise SpecError(
                "InvalidSpec",
                f"spec.engine.speculative method draftModel is not supported with "
                f"spec.engine.quantization {e.quantization} (the draft would run unquantized "
                "beside FP8 weights): drop one of them",
            )

    def _check_adapters(self) -> None:
        """What `pagoda serve --enable-lora` refuses at start (a crash loop), refused here."""
        if not self.adapters:
            if self.engine.lora is not None:
                raise SpecError(
                    "InvalidSpec",
                    "spec.engine.lora configures spec.adapters: add adapters or drop it",
                )
            return
        self.lora_values()  # maxCpuLoras >= maxLoras, defaults filled
        if self.engine.speculative is not None:
            raise SpecError(
                "InvalidSpec",
                "spec.adapters (LoRA) is not supported with spec.engine.speculative: drop one "
                "of them",
            )

    def lora_values(self) -> tuple[int, int, int]:
        """(maxLoras, maxLoraRank, maxCpuLoras) for spec.adapters, defaults filled in."""
        return (self.engine.lora or LoraSpec()).effective(len(self.adapters))

    @property
    def downloads(self) -> bool:
        """Something is downloaded into the model cache: an hf:// or s3:// model, adapter or
        draft model."""
        draft = self.engine.draft is not None and self.engine.draft.remote
        return self.model.remote or draft or any(a.remote for a in self.adapters)

    def _check_split(self) -> None:
        """A built-in model's shape is known up front: a tensor-parallel size it cannot be split
        over is refused here instead of every pod exiting at start (`pagoda serve` runs the same
        arithmetic, `options.tensor_parallel_problem`)."""
        builtin = (
            options.BUILTIN_MODELS.get(self.model.uri) if self.model.source == "builtin" else None
        )
        tp = self.tensor_parallel_size
        problem = builtin.tensor_parallel_problem(tp) if builtin is not None else None
        if problem is not None:
            raise SpecError(
                "InvalidSpec",
                f"spec.model {self.model.uri} cannot be sharded over {tp} tensor-parallel ranks "
                f"(resources.gpus × parallelism.nodes, or parallelism.tensorParallelSize): "
                f"{problem}",
            )

    @property
    def tensor_parallel_size(self) -> int:
        """Ranks the model is sharded over (`pagoda serve --tensor-parallel-size`)."""
        return self.parallelism.tensor_size(self.resources.gpus)

    @property
    def multi_node(self) -> bool:
        """A group of several pods: a LeaderWorkerSet instead of a Deployment."""
        return self.parallelism.nodes > 1

    @property
    def workload_kind(self) -> str:
        """The kind that runs the pods (what the autoscaler scales)."""
        return "LeaderWorkerSet" if self.multi_node else "Deployment"

    @property
    def min_replicas(self) -> int:
        """The fewest replicas the service may run with (decides whether a PDB makes sense)."""
        return self.autoscaling.min_replicas if self.autoscaling else self.replicas

    def desired_replicas(self, current: int | None, *, replacing: bool = False) -> int | None:
        """The Deployment's replicas as the reconciler writes them; None: not the reconciler's.

        One field, one writer. Without `spec.autoscaling` the reconciler owns the number and
        writes `spec.replicas` (a hand-scaled Deployment is scaled back). With it the reconciler
        writes the number once, when it creates the workload, and afterwards leaves it out of
        what it applies: the autoscaler is the only writer (it also clamps it into new bounds at
        its next evaluation). The first number is `minReplicas` (`current` None), or, when the
        new workload `replacing` one of the other kind (a switch between a Deployment and a
        LeaderWorkerSet), that one's `current` replicas clamped into the bounds: the
        autoscaler's choice survives the switch instead of falling to the API's default of 1.
        """
        if self.autoscaling is None:
            return self.replicas
        if current is None:
            return self.autoscaling.min_replicas
        return self.autoscaling.clamp(current) if replacing else None

    @classmethod
    def from_dict(
        cls,
        spec: Mapping[str, Any],
        *,
        name: str,
        default_image: str,
        pod_ids: PodIds = PodIds(),
    ) -> InferenceServiceSpec:
        if not isinstance(spec, Mapping):
            raise SpecError("InvalidSpec", "spec must be an object")
        if not _DNS1035.match(name) or len(name) > MAX_NAME_LENGTH:
            raise SpecError(
                "InvalidName",
                f"metadata.name {show(name)} must be a DNS-1035 label (lowercase letters, digits, '-', "
                f"starting with a letter) of at most {MAX_NAME_LENGTH} characters",
            )
        model = _model(spec)
        served = opt_str(
            spec, "servedModelName", "spec", max_len=MAX_SERVED_NAME, pattern=_SERVED_NAME
        ) or (model.uri if model.source == "builtin" else name)
        adapters = parse_adapters(spec, model)
        check_served_names(  # as the CRD's rule: servedModelName (else metadata.name), spec.model
            adapters, (served, model.uri, *(() if spec.get("servedModelName") else (name,)))
        )
        node_selector = pod_fields.node_selector(spec)
        autoscaling = spec.get("autoscaling")
        if autoscaling is not None and not isinstance(autoscaling, Mapping):
            raise SpecError(
                "InvalidSpec", f"spec.autoscaling must be an object, got {show(autoscaling)}"
            )
        parallelism = ParallelismSpec.from_dict(_or_empty(spec.get("parallelism")))
        if parallelism.nodes > 1 and len(name) > MAX_GROUP_NAME_LENGTH:
            raise SpecError(
                "InvalidName",
                f"metadata.name of a multi-node service (spec.parallelism.nodes > 1) must be at "
                f"most {MAX_GROUP_NAME_LENGTH} characters (its pods' names and labels add the "
                f"group's), got {len(name)}",
            )
        return cls(
            model=model,
            served_model_name=served,
            image=opt_str(spec, "image", "spec", max_len=MAX_IMAGE, pattern=_IMAGE)
            or default_image,
            image_pull_policy=choice(
                spec, "imagePullPolicy", "spec", PULL_POLICIES, "IfNotPresent"
            ),
            replicas=int_or(spec, "replicas", "spec", 0, 100, DEFAULT_REPLICAS),
            resources=ResourcesSpec.from_dict(mapping(spec, "resources", "spec")),
            engine=_engine(spec, model),
            autoscaling=None if autoscaling is None else AutoscalingSpec.from_dict(autoscaling),
            autotune=AutotuneSpec.from_dict(_or_empty(spec.get("autotune"))),
            parallelism=parallelism,
            api_key_secret=pod_fields.secret_ref(spec),
            model_cache=ModelCacheSpec.from_dict(mapping(spec, "modelCache", "spec")),
            model_secret=pod_fields.model_secret(spec),
            adapters=adapters,
            node_selector=tuple(sorted(node_selector.items())),
            tolerations=tuple(pod_fields.tolerations(spec, MAX_TOLERATIONS)),
            env=tuple(pod_fields.env(spec, MAX_ENV, MAX_ENV_NAME)),
            startup_timeout_seconds=int_or(
                spec, "startupTimeoutSeconds", "spec", 30, 14400, DEFAULT_STARTUP_TIMEOUT_S
            ),
            drain_timeout_seconds=int_or(
                spec, "drainTimeoutSeconds", "spec", 0, 3600, DEFAULT_DRAIN_TIMEOUT_S
            ),
            pod_ids=pod_ids,
        )


def _engine(spec: Mapping[str, Any], model: ModelRef) -> EngineSpec:
    """`spec.engine` with its extraArgs (spec/pod_fields.py), lora and the draft model
    (spec/model_ref.py)."""
    engine = mapping(spec, "engine", "spec")
    extra = pod_fields.extra_args(engine, "spec.engine")
    return EngineSpec.from_dict(
        engine, extra_args=extra, lora=LoraSpec.from_dict(engine), draft=parse_draft(engine, model)
    )


def _or_empty(value: Any) -> Any:
    """An optional object as given, {} for null (`[]` or `false` reach the parser and are refused)."""
    return {} if value is None else value


def _model(spec: Mapping[str, Any]) -> ModelRef:
    value = spec.get("model")
    if value is None or value == "":
        raise SpecError("InvalidSpec", "spec.model is required")
    if not isinstance(value, str):
        raise SpecError("InvalidSpec", f"spec.model must be a string, got {show(value)}")
    if len(value) > MAX_MODEL:
        raise SpecError(
            "InvalidSpec",
            f"spec.model must be at most {MAX_MODEL} characters, got {len(value)}: {show(value)}",
        )
    return ModelRef.parse(value)
