"""`Parallelism`: where this process sits in a tensor-parallel group, from the `PARALLEL_FLAGS`
of `pagoda serve` (docs/operator.md, multi-node groups). Torch-free: the parser checks it before
anything heavy is imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.option_rules import check_integers, short_repr
from pagoda.runtime.options import (
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    DEFAULT_NNODES,
    DEFAULT_NODE_RANK,
    DEFAULT_TENSOR_PARALLEL_SIZE,
    MAX_TENSOR_PARALLEL_SIZE,
    PARALLEL_FLAGS,
)


@dataclass(frozen=True)
class Parallelism:
    """Where this process sits in a tensor-parallel group; validated once (ValueError names the
    flag). Rank r of the group runs on node r // ranks_per_node."""

    tensor_parallel_size: int = DEFAULT_TENSOR_PARALLEL_SIZE
    nnodes: int = DEFAULT_NNODES
    node_rank: int = DEFAULT_NODE_RANK
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT

    def __post_init__(self) -> None:
        check_integers(self, ("tensor_parallel_size", "nnodes", "node_rank", "master_port"))
        if self.master_addr is not None and not isinstance(self.master_addr, str):
            raise ValueError(f"master_addr must be a string, got {short_repr(self.master_addr)}")
        tp, nodes = self.tensor_parallel_size, self.nnodes
        if not 1 <= tp <= MAX_TENSOR_PARALLEL_SIZE:
            raise ValueError(f"--tensor-parallel-size must be in 1..{MAX_TENSOR_PARALLEL_SIZE}, "
                             f"got {tp}")  # fmt: skip
        if not 1 <= nodes <= tp or tp % nodes:
            raise ValueError(f"--nnodes ({nodes}) must divide --tensor-parallel-size ({tp}): "
                             "every node runs the same number of ranks")  # fmt: skip
        if not 0 <= self.node_rank < nodes:
            raise ValueError(f"--node-rank must be in 0..{nodes - 1} (--nnodes {nodes}), got "
                             f"{self.node_rank}")  # fmt: skip
        if nodes > 1 and not self.master_addr:
            raise ValueError(f"--nnodes {nodes} needs --master-addr (node 0's address)")
        if not 1 <= self.master_port <= 65535:
            raise ValueError(f"--master-port must be in 1..65535, got {self.master_port}")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes

    @property
    def is_worker(self) -> bool:
        """A headless node: no HTTP server; it runs the steps rank 0 broadcasts."""
        return self.node_rank > 0

    @property
    def address(self) -> str:
        return self.master_addr or DEFAULT_MASTER_ADDR

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Parallelism:
        """From flag values by destination (an argparse Namespace's `vars`)."""
        return cls(**{d: values[d] for d in PARALLEL_FLAGS if values.get(d) is not None})
