"""What one bucket's sweep found: the data every sweep (attention, matmul, fused MoE) returns
and the tune report prints; a module of its own so the sweeps need not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class BucketResult:
    bucket: Any  # the swept bucket: has .kernel and .shape
    config: dict[str, Any] | None  # None: every candidate was rejected
    median_ms: float | None
    default_ms: float | None
    tried: int
    rejected: list[str]

    def as_json(self) -> dict[str, Any]:
        speedup = None
        if self.median_ms and self.default_ms:
            speedup = round(self.default_ms / self.median_ms, 3)
        return {
            "kernel": self.bucket.kernel,
            "shape": dict(self.bucket.shape),
            "config": self.config,
            "median_ms": self.median_ms,
            "default_ms": self.default_ms,
            "speedup": speedup,
            "candidates": self.tried,
            "rejected": self.rejected,
        }
