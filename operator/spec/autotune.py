"""`spec.autotune`: whether and how the operator tunes the nodes this service runs on.

The targets default to `pagoda tune`'s own (pagoda.runtime.options), so services that do not set
them share one profile per GPU product.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.spec.fields import SpecError, bool_or, int_or, opt_number, show
from pagoda.runtime import options

DEFAULT_TIME_BUDGET_S = 900  # `pagoda tune --time-budget 15m`
MIN_TIME_BUDGET_S, MAX_TIME_BUDGET_S = 60, 14400


@dataclass(frozen=True)
class AutotuneSpec:
    enabled: bool = False
    time_budget_seconds: int = DEFAULT_TIME_BUDGET_S
    ttft_target_s: float = options.DEFAULT_TTFT_TARGET_S
    itl_target_s: float = options.DEFAULT_ITL_TARGET_S

    def __post_init__(self) -> None:
        if not MIN_TIME_BUDGET_S <= self.time_budget_seconds <= MAX_TIME_BUDGET_S:
            raise SpecError(
                "InvalidSpec",
                f"spec.autotune.timeBudgetSeconds must be between {MIN_TIME_BUDGET_S} and "
                f"{MAX_TIME_BUDGET_S}, got {self.time_budget_seconds}",
            )
        if self.ttft_target_s <= 0 or self.itl_target_s <= 0:
            raise SpecError("InvalidSpec", "spec.autotune targets must be positive")

    @classmethod
    def from_dict(cls, d: Any) -> AutotuneSpec:
        p = "spec.autotune"
        if not isinstance(d, Mapping):
            raise SpecError("InvalidSpec", f"{p} must be an object, got {show(d)}")
        targets = {} if d.get("targets") is None else d["targets"]
        if not isinstance(targets, Mapping):
            raise SpecError("InvalidSpec", f"{p}.targets must be an object, got {show(targets)}")
        ttft = opt_number(targets, "ttftSeconds", f"{p}.targets", 0.001)
        itl = opt_number(targets, "itlSeconds", f"{p}.targets", 0.0001)
        return cls(
            enabled=bool_or(d, "enabled", p, False),
            time_budget_seconds=int_or(
                d,
                "timeBudgetSeconds",
                p,
                MIN_TIME_BUDGET_S,
                MAX_TIME_BUDGET_S,
                DEFAULT_TIME_BUDGET_S,
            ),
            ttft_target_s=options.DEFAULT_TTFT_TARGET_S if ttft is None else ttft,
            itl_target_s=options.DEFAULT_ITL_TARGET_S if itl is None else itl,
        )
