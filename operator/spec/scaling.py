"""How a service scales: one model sharded over GPUs and pods (`spec.parallelism`), and the
bounds and targets the autoscaler keeps its replicas in (`spec.autoscaling`). Pure.

    resources: {gpus: 8}                 # one pod, tensor parallel over its 8 GPUs
    parallelism: {nodes: 2}              # + a LeaderWorkerSet group of 2 pods: 16 ranks
    parallelism: {nodes: 2, tensorParallelSize: 16}   # the same, stated (checked)

The tensor-parallel size counts ranks across the whole group: one rank per GPU, so with GPUs it is
`resources.gpus × nodes` (the default; stating another number is refused). On CPU pods
(`resources.gpus` 0) it is free, a multiple of `nodes`, each pod running `tensorParallelSize /
nodes` processes (default: one per pod). `nodes` > 1 renders a LeaderWorkerSet instead of a
Deployment (children/leaderworkerset.py); `replicas` then counts groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.spec.fields import (
    SpecError,
    base_url_problem,
    int_or,
    opt_int,
    opt_number,
    opt_str,
    show,
)
from pagoda.runtime import options

DEFAULT_TOLERANCE = 0.1  # the CRD's default too (test_operator_crd.py checks they agree)
MAX_URL = 2048  # spec.autoscaling.prometheusURL, the CRD's maxLength
MAX_NODES = 64
MAX_TENSOR_PARALLEL_SIZE = options.MAX_TENSOR_PARALLEL_SIZE
P = "spec.parallelism"


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


@dataclass(frozen=True)
class ParallelismSpec:
    nodes: int = 1
    tensor_parallel_size: int | None = None  # None: resources.gpus × nodes (CPU: nodes)

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise SpecError("InvalidSpec", f"{P}.nodes must be between 1 and {MAX_NODES}")
        tp = self.tensor_parallel_size
        if tp is not None and tp % self.nodes:
            raise SpecError(
                "InvalidSpec",
                f"{P}.tensorParallelSize ({tp}) must be a multiple of nodes ({self.nodes}): "
                "every pod of a group runs the same number of ranks",
            )

    @classmethod
    def from_dict(cls, d: Any) -> ParallelismSpec:
        if not isinstance(d, Mapping):
            raise SpecError("InvalidSpec", f"{P} must be an object, got {show(d)}")
        return cls(
            nodes=int_or(d, "nodes", P, 1, MAX_NODES, 1),
            tensor_parallel_size=opt_int(d, "tensorParallelSize", P, 1, MAX_TENSOR_PARALLEL_SIZE),
        )

    def tensor_size(self, gpus: int) -> int:
        """The group's tensor-parallel size (ranks over all its pods) with `gpus` per pod."""
        if self.tensor_parallel_size is not None:
            return self.tensor_parallel_size
        return max(gpus, 1) * self.nodes

    def check(self, gpus: int) -> None:
        """With GPUs, one rank per GPU: the stated size must be gpus × nodes."""
        tp = self.tensor_parallel_size
        if gpus and tp is not None and tp != gpus * self.nodes:
            raise SpecError(
                "InvalidSpec",
                f"{P}.tensorParallelSize ({tp}) must equal resources.gpus ({gpus}) × nodes "
                f"({self.nodes}) = {gpus * self.nodes}: one rank per GPU",
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
