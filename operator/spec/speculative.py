"""`spec.engine.speculative` → the runtime's own frozen `SpeculativeConfig` (vLLM's
`--speculative-config` JSON, `pagoda.runtime.spec.config`, torch-free).

The CRD's bounds are the runtime's (`MAX_SPECULATIVE_TOKENS`, `MAX_PROMPT_LOOKUP`;
test_operator_crd.py compares them); every problem names its camelCase field, so a spec the API
server's schema did not check gets the same `Degraded` reason as one it refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.operator.spec.fields import SpecError, choice, opt_int, show
from pagoda.runtime.spec.config import (
    MAX_PROMPT_LOOKUP,
    MAX_SPECULATIVE_TOKENS,
    METHODS,
    SpeculativeConfig,
)

P = "spec.engine.speculative"
KEYS = ("method", "numSpeculativeTokens", "promptLookupMax", "promptLookupMin")


def parse(d: Mapping[str, Any]) -> SpeculativeConfig | None:
    """The config of `spec.engine.speculative`; None when the field is absent or null."""
    value = d.get("speculative")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("InvalidSpec", f"{P} must be an object, got {show(value)}")
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise SpecError(
            "InvalidSpec", f"{P}: unknown field(s) {', '.join(unknown)} (known: {', '.join(KEYS)})"
        )
    tokens = opt_int(value, "numSpeculativeTokens", P, 1, MAX_SPECULATIVE_TOKENS)
    if tokens is None:
        raise SpecError("InvalidSpec", f"{P}.numSpeculativeTokens is required")
    hi = opt_int(value, "promptLookupMax", P, 1, MAX_PROMPT_LOOKUP)
    lo = opt_int(value, "promptLookupMin", P, 1, MAX_PROMPT_LOOKUP)
    if hi is not None and lo is not None and lo > hi:
        raise SpecError(
            "InvalidSpec", f"{P}.promptLookupMin ({lo}) must be <= promptLookupMax ({hi})"
        )
    return SpeculativeConfig(
        num_speculative_tokens=tokens,
        method=choice(value, "method", P, METHODS, METHODS[0]),
        prompt_lookup_max=hi,
        prompt_lookup_min=lo,
    )


def record(config: SpeculativeConfig) -> dict[str, Any]:
    """The effective config as the ConfigMap records it (camelCase, bounds filled in)."""
    return {
        "method": config.method,
        "numSpeculativeTokens": config.num_speculative_tokens,
        "promptLookupMax": config.prompt_lookup_max,
        "promptLookupMin": config.prompt_lookup_min,
    }
