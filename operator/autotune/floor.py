"""The autoscaler's predictive floor from a tuned profile's prefill rate V_P. Pure.

llm-d's token-aware rule: a request of ISL prompt tokens needs ISL / V_P seconds of prefill, so
of a TTFT target T it leaves `T − ISL/V_P` for the prompt tokens queued ahead of it. A replica
prefills V_P tokens/s, so Q queued prompt tokens need `Q / (V_P · (T − ISL/V_P))` replicas to be
through within the target. That count is a floor: the HPA-style ratio reacts to TTFT once it is
already high, this reacts to the queue the moment it forms. With no profile (V_P unknown), no
queue, or a target a lone prompt cannot meet (T ≤ ISL/V_P: more replicas do not help) there is
no floor.
"""

from __future__ import annotations

import math

HUGE_NEED = 10**6  # replicas; far above any maxReplicas (the CRD allows 100)


def ceil_replicas(x: float) -> int:
    """⌈x⌉ replicas, saturating: a need too large to count, or NaN (∞ − ∞ of absurd inputs), is
    HUGE_NEED, which the policy clamps to maxReplicas (math.ceil would raise)."""
    if not x < HUGE_NEED:
        return HUGE_NEED
    return math.ceil(x - 1e-9)


def prefill_floor(
    queued_prompt_tokens: float | None,
    prefill_tokens_per_s: float | None,
    ttft_target_s: float | None,
    prompt_tokens: float | None,
) -> int | None:
    """Fewest replicas that prefill the queue within the TTFT target (None: no floor)."""
    if not queued_prompt_tokens or not prefill_tokens_per_s or not ttft_target_s:
        return None
    if queued_prompt_tokens <= 0 or prefill_tokens_per_s <= 0:
        return None
    budget = ttft_target_s - (prompt_tokens or 0.0) / prefill_tokens_per_s
    if budget <= 0:
        return None
    return max(1, ceil_replicas(queued_prompt_tokens / (prefill_tokens_per_s * budget)))
