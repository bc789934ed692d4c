"""`spec.parallelism`: one model sharded over several GPUs, in one pod or a multi-node group.

    resources: {gpus: 8}                 # one pod, tensor parallel over its 8 GPUs
    parallelism: {nodes: 2}              # + a LeaderWorkerSet group of 2 pods: 16 ranks
    parallelism: {nodes: 2, tensorParallelSize: 16}   # the same, stated (checked)

The tensor-parallel size counts ranks across the whole group: one rank per GPU, so with GPUs it is
`resources.gpus × nodes` (the default; stating another number is refused). On CPU pods
(`resources.gpus` 0) it is free, a multiple of `nodes`, each pod running `tensorParallelSize /
nodes` processes (default: one per pod). `nodes` > 1 renders a LeaderWorkerSet instead of a
Deployment (children/leaderworkerset.py); `replicas` then counts groups. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.spec.fields import SpecError, int_or, opt_int, show
from pagoda.runtime import options

MAX_NODES = 64
MAX_TENSOR_PARALLEL_SIZE = options.MAX_TENSOR_PARALLEL_SIZE
P = "spec.parallelism"


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
