"""The InferenceService spec as frozen dataclasses: parsed, defaulted and checked.

The CRD's OpenAPI schema (crds/inferenceservice.yaml) is the first line of defence; this module
is the second, so the operator behaves the same on an API server that applies the schema and on
one that does not (an emulator, or a CR written before a schema change). Defaults here must equal
the CRD's defaults (a test compares them). Every problem raises :class:`SpecError` with a
CamelCase reason that ends up in the `Degraded` condition.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator.kube.drift import parse_quantity
from pagoda.operator.kube.names import MAX_GROUP_NAME_LENGTH, PodIds
from pagoda.operator.spec import pod_fields
from pagoda.operator.spec.autotune import AutotuneSpec
from pagoda.operator.spec.fields import (
    SpecError,
    base_url_problem,
    bool_or,
    choice,
    closed_object,
    int_or,
    mapping,
    opt_int,
    opt_number,
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
)
from pagoda.operator.spec.parallelism import ParallelismSpec
from pagoda.runtime import options
from pagoda.runtime.option_rules import CRD_ENGINE_RULES, CRD_FLAG_RULES, camel
from pagoda.runtime.spec import config as spec_config  # SpeculativeConfig: standard library only

# The engine's choices and defaults are the runtime's (pagoda.runtime.options, torch-free); the
# CRD's enums and defaults equal them (test_operator_crd.py). Aliases such as "half" are the CLI's
# only: the CRD takes canonical names.
DTYPES = options.DTYPES
ATTENTION_BACKENDS = options.ATTENTION_BACKENDS
BLOCK_SIZES = options.BLOCK_SIZES
KV_CACHE_DTYPES = options.KV_CACHE_DTYPES
QUANTIZATIONS = options.QUANTIZATIONS
RUNNERS = options.RUNNERS
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_NAME_LENGTH = 52  # leaves room for the "-config" suffix and pod-name hashes

# Defaults shared with the CRD schema (test_operator_crd.py checks they agree).
DEFAULT_REPLICAS = 1
DEFAULT_STARTUP_TIMEOUT_S = 1800
# How long an hf:// or s3:// model's download may take before the rollout counts as stalled
# (spec.modelCache.downloadDeadlineSeconds; added to the Deployment's progressDeadlineSeconds).
DEFAULT_DOWNLOAD_DEADLINE_S = 3600
DEFAULT_DRAIN_TIMEOUT_S = int(options.DEFAULT_DRAIN_TIMEOUT_S)  # the CRD's field is an integer
DEFAULT_API_KEY_KEY = "api-key"
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"
DEFAULT_TOLERANCE = 0.1

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_IMAGE = re.compile(r"^\S+$")  # the API server refuses an image with whitespace
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
# The CRD's length and size limits, enforced here too (the schema may not be applied).
MAX_MODEL = 1024
MAX_SERVED_NAME = 256
MAX_IMAGE = 512
MAX_URL = 2048
MAX_SECRET_FIELD = 253
MAX_ENV_NAME = 256
MAX_EXTRA_ARGS, MAX_EXTRA_ARG = 64, 1024
MAX_TOLERATIONS = 32
MAX_ENV = 128


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


# --- the spec ---------------------------------------------------------------------------------


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
class EngineSpec:
    """Flags of `pagoda serve`; None means "the runtime's own default"."""

    dtype: str = options.DEFAULT_DTYPE
    enable_prefix_caching: bool = options.DEFAULT_ENABLE_PREFIX_CACHING
    enable_chunked_prefill: bool = options.DEFAULT_ENABLE_CHUNKED_PREFILL
    attention_backend: str = options.DEFAULT_ATTENTION_BACKEND
    block_size: int = options.DEFAULT_BLOCK_SIZE
    kv_cache_dtype: str = options.DEFAULT_KV_CACHE_DTYPE
    quantization: str | None = None  # None: the checkpoint's own (16-bit, or its FP8 format)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    max_queue_len: int | None = None
    # the largest prefill chunk of one prompt while others run or wait; 0: off (None: by device)
    long_prefill_token_threshold: int | None = None
    # n-gram speculative decoding (`--speculative-config`); None: off
    speculative: spec_config.SpeculativeConfig | None = None
    # `--runner` (generate, pooling: an embedding model, auto); None: the runtime's (auto)
    runner: str | None = None
    # `--max-loras` and the rest with spec.adapters (spec/model_ref.py); None: their defaults
    lora: LoraSpec | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError("InvalidSpec", f"spec.engine.dtype must be one of {', '.join(DTYPES)}")
        if self.block_size not in BLOCK_SIZES:
            raise SpecError("InvalidSpec", f"spec.engine.blockSize must be one of {BLOCK_SIZES}")
        if self.speculative is not None and any(
            pod_fields.flag_dest(a) == "async_scheduling" and not a.startswith("--no-")
            for a in self.extra_args
        ):
            raise SpecError(  # `pagoda serve` refuses the two together at start
                "InvalidSpec",
                "spec.engine.speculative runs with synchronous scheduling only: drop "
                "--async-scheduling from spec.engine.extraArgs",
            )
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # flag names
        for needs in CRD_FLAG_RULES:
            if not needs.holds(values):
                raise SpecError("InvalidSpec", needs.spec_error(values))
        for rule in CRD_ENGINE_RULES:  # as `pagoda serve` checks them: defaults filled in
            filled = rule.filled(values)
            if not rule.holds(filled):
                unset = " when unset" if values.get(rule.smaller) is None else ""
                raise SpecError(
                    "InvalidSpec",
                    f"spec.engine.{camel(rule.larger)} ({filled[rule.larger]}) must be >= "
                    f"{camel(rule.smaller)} ({filled[rule.smaller]}{unset})",
                )

    def lora_values(self, adapters: int) -> tuple[int, int, int]:
        """(maxLoras, maxLoraRank, maxCpuLoras) with `adapters` declared, defaults filled in."""
        return (self.lora or LoraSpec()).effective(adapters)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineSpec:
        p = "spec.engine"
        extra = [] if d.get("extraArgs") is None else d["extraArgs"]
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise SpecError("InvalidSpec", f"{p}.extraArgs must be a list of strings")
        if len(extra) > MAX_EXTRA_ARGS or any(len(a) > MAX_EXTRA_ARG for a in extra):
            raise SpecError(
                "InvalidSpec",
                f"{p}.extraArgs: at most {MAX_EXTRA_ARGS} items of at most {MAX_EXTRA_ARG} characters",
            )
        pod_fields.check_extra_args(extra, p)
        return cls(
            dtype=choice(d, "dtype", p, DTYPES, cls.dtype),
            enable_prefix_caching=bool_or(d, "enablePrefixCaching", p, cls.enable_prefix_caching),
            enable_chunked_prefill=bool_or(
                d, "enableChunkedPrefill", p, cls.enable_chunked_prefill
            ),
            attention_backend=choice(
                d, "attentionBackend", p, ATTENTION_BACKENDS, cls.attention_backend
            ),
            block_size=choice(d, "blockSize", p, BLOCK_SIZES, cls.block_size),
            kv_cache_dtype=choice(d, "kvCacheDtype", p, KV_CACHE_DTYPES, cls.kv_cache_dtype),
            quantization=(
                choice(d, "quantization", p, QUANTIZATIONS, None)
                if d.get("quantization") is not None
                else None
            ),
            max_num_seqs=opt_int(d, "maxNumSeqs", p, 1, 4096),
            max_num_batched_tokens=opt_int(d, "maxNumBatchedTokens", p, 1, 1 << 20),
            max_model_len=opt_int(d, "maxModelLen", p, 2, 1 << 20),  # a prompt token + one out
            max_queue_len=opt_int(d, "maxQueueLen", p, 1, 1 << 20),
            long_prefill_token_threshold=opt_int(d, "longPrefillTokenThreshold", p, 0, 1 << 20),
            speculative=_speculative(d, p),
            runner=choice(d, "runner", p, RUNNERS, None) if d.get("runner") is not None else None,
            lora=LoraSpec.from_dict(d),
            extra_args=tuple(extra),
        )


@dataclass(frozen=True)
class AutoscalingSpec:
    max_replicas: int
    min_replicas: int = 1
    target_ttft_seconds: float | None = None
    target_queue_depth: float | None = None
    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int = 300
    tolerance: float = DEFAULT_TOLERANCE  # no change while |metric/target - 1| is within it
    prometheus_url: str | None = None  # overrides the operator's --prometheus-url

    def __post_init__(self) -> None:
        if not 0 <= self.tolerance <= 1:
            raise SpecError("InvalidSpec", "spec.autoscaling.tolerance must be in [0, 1]")
        url = self.prometheus_url
        if url is not None and (why := base_url_problem(url, credentials=False)):
            shown = show(url) if "@" not in url else "(not shown: it holds credentials)"
            raise SpecError("InvalidSpec", f"spec.autoscaling.prometheusURL {why}, got {shown}")
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
        max_replicas = opt_int(d, "maxReplicas", p, 1, 100)
        if max_replicas is None:
            raise SpecError("InvalidSpec", f"{p}.maxReplicas is required")
        return cls(
            max_replicas=max_replicas,
            min_replicas=int_or(d, "minReplicas", p, 1, 100, 1),
            target_ttft_seconds=opt_number(d, "targetTTFTSeconds", p, 0.001),
            target_queue_depth=opt_number(d, "targetQueueDepth", p, 0.0),
            scale_up_stabilization_seconds=int_or(d, "scaleUpStabilizationSeconds", p, 0, 3600, 0),
            scale_down_stabilization_seconds=int_or(
                d, "scaleDownStabilizationSeconds", p, 0, 3600, 300
            ),
            tolerance=_or(opt_number(d, "tolerance", p, 0.0), DEFAULT_TOLERANCE),
            prometheus_url=opt_str(d, "prometheusURL", p, max_len=MAX_URL),
        )

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


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
        claim = opt_str(d, "claimName", p, max_len=MAX_SECRET_FIELD)
        if claim is not None and not _DNS1123_SUBDOMAIN.match(claim):
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
    autotune: AutotuneSpec = field(default_factory=AutotuneSpec)
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    api_key_secret: SecretKeyRef | None = None
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
                "(and to hf:// and s3:// spec.adapters)",
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
        if self.engine.speculative is not None and self.tensor_parallel_size > 1:
            raise SpecError(  # `pagoda serve` refuses it at start (a crash loop)
                "InvalidSpec",
                "spec.engine.speculative is not supported with tensor parallelism "
                f"(tensorParallelSize {self.tensor_parallel_size}: resources.gpus × "
                "parallelism.nodes, or parallelism.tensorParallelSize): drop one of them",
            )
        self._check_adapters()
        self._check_split()

    def _check_adapters(self) -> None:
        """What `pagoda serve --enable-lora` refuses at start (a crash loop), refused here."""
        if not self.adapters:
            if self.engine.lora is not None:
                raise SpecError(
                    "InvalidSpec",
                    "spec.engine.lora configures spec.adapters: add adapters or drop it",
                )
            return
        self.engine.lora_values(len(self.adapters))  # maxCpuLoras >= maxLoras, defaults filled
        for what, on in (
            ("spec.engine.speculative", self.engine.speculative is not None),
            ("spec.engine.quantization fp8", self.engine.quantization == "fp8"),
        ):  # fmt: skip
            if on:
                raise SpecError(
                    "InvalidSpec",
                    f"spec.adapters (LoRA) is not supported with {what}: drop one of them",
                )

    @property
    def downloads(self) -> bool:
        """Something is downloaded into the model cache: an hf:// or s3:// model or adapter."""
        return self.model.remote or any(a.remote for a in self.adapters)

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
            engine=EngineSpec.from_dict(mapping(spec, "engine", "spec")),
            autoscaling=None if autoscaling is None else AutoscalingSpec.from_dict(autoscaling),
            autotune=AutotuneSpec.from_dict(_or_empty(spec.get("autotune"))),
            parallelism=parallelism,
            api_key_secret=_secret_ref(spec),
            model_cache=ModelCacheSpec.from_dict(mapping(spec, "modelCache", "spec")),
            model_secret=_model_secret(spec),
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


SPECULATIVE_KEYS = ("method", "numSpeculativeTokens", "promptLookupMax", "promptLookupMin")


def _speculative(engine: Mapping[str, Any], path: str) -> spec_config.SpeculativeConfig | None:
    """`spec.engine.speculative` → the runtime's own frozen `SpeculativeConfig` (vLLM's
    `--speculative-config` keys), with the runtime's bounds (the CRD's equal them) and camelCase
    names in every message; None when absent or null."""
    p = f"{path}.speculative"
    value = closed_object(engine, "speculative", path, SPECULATIVE_KEYS)
    if value is None:
        return None
    tokens = opt_int(value, "numSpeculativeTokens", p, 1, spec_config.MAX_SPECULATIVE_TOKENS)
    if tokens is None:
        raise SpecError("InvalidSpec", f"{p}.numSpeculativeTokens is required")
    hi = opt_int(value, "promptLookupMax", p, 1, spec_config.MAX_PROMPT_LOOKUP)
    lo = opt_int(value, "promptLookupMin", p, 1, spec_config.MAX_PROMPT_LOOKUP)
    if hi is not None and lo is not None and lo > hi:
        raise SpecError(
            "InvalidSpec", f"{p}.promptLookupMin ({lo}) must be <= promptLookupMax ({hi})"
        )
    return spec_config.SpeculativeConfig(  # fills an unset bound as `pagoda serve` does
        num_speculative_tokens=tokens,
        method=choice(value, "method", p, spec_config.METHODS, spec_config.METHODS[0]),
        prompt_lookup_max=hi,
        prompt_lookup_min=lo,
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


def _secret_ref(spec: Mapping[str, Any]) -> SecretKeyRef | None:
    secret = spec.get("apiKeySecretRef")
    if secret is None:
        return None
    p = "spec.apiKeySecretRef"
    if not isinstance(secret, Mapping):
        raise SpecError("InvalidSpec", f"{p} must be an object, got {show(secret)}")
    name = opt_str(secret, "name", p, max_len=MAX_SECRET_FIELD)
    if not name:
        raise SpecError("InvalidSpec", f"{p}.name is required")
    if not _DNS1123_SUBDOMAIN.match(name):
        raise SpecError("InvalidSpec", f"{p}.name must be a Secret's name, got {show(name)}")
    key = opt_str(secret, "key", p, max_len=MAX_SECRET_FIELD) or DEFAULT_API_KEY_KEY
    if not _SECRET_KEY.match(key):
        raise SpecError(
            "InvalidSpec",
            f"{p}.key must be a Secret key (letters, digits, '-', '_', '.'), got {show(key)}",
        )
    return SecretKeyRef(name, key)


def _model_secret(spec: Mapping[str, Any]) -> str | None:
    ref = spec.get("modelSecretRef")
    if ref is None:
        return None
    p = "spec.modelSecretRef"
    if not isinstance(ref, Mapping):
        raise SpecError("InvalidSpec", f"{p} must be an object, got {show(ref)}")
    name = opt_str(ref, "name", p, max_len=MAX_SECRET_FIELD)
    if not name or not _DNS1123_SUBDOMAIN.match(name):
        raise SpecError("InvalidSpec", f"{p}.name must be a Secret's name, got {show(name)}")
    return name
