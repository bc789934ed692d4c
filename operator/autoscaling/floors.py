"""The predictive floors of an autoscaling decision (policy.py's `decide`), from the measured
load where a tuned profile gives the rates. Pure.

* the **demand floor** (demand.py), with V_P and V_D: its learned capacity correction updated
  from this evaluation (raised while a fleet at the floor still queues), then the floor itself;
* the **burst floor** (bursts.py), with the demand floor: this evaluation's fast need recorded,
  the demand raised to the need of recurring, scheduled or young bursts;
* the **prefill floor** (autotune/floor.py), with V_P alone: the queued prompt tokens against
  the TTFT budget.

A recommendation below the floor is raised to it (`raise_to_floor`), with the floor's reason.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pagoda.operator.autoscaling import bursts as bursts_mod
from pagoda.operator.autoscaling.demand import (
    CORRECTION_PERIOD_S,
    Demand,
    demand_floor,
    learn_correction,
    request_work,
)
from pagoda.operator.autotune.floor import ceil_replicas, prefill_floor

if TYPE_CHECKING:
    from pagoda.operator.autoscaling.policy import History, Metrics, Policy


def measured_demand(
    policy: Policy,
    metrics: Metrics,
    ratio: float,
    *,
    current: int,
    ready: int,
    history: History,
    now: float,
    correction: float,
    bursts: bursts_mod.Bursts,
) -> tuple[Demand | None, float, bursts_mod.Bursts]:
    """The demand floor (None without a tuned profile's V_P and V_D), after learning the
    capacity correction from this evaluation and raising it to the burst floor; with the
    correction and burst state to keep."""
    demand = _demand(policy, metrics, correction)
    if demand is None:
        return None, correction, bursts
    overloaded = ratio > 1.0 + policy.tolerance and metrics.waiting > 0
    at_floor = ready >= current >= demand.replicas
    elapsed = now - history[-1][0] if history else CORRECTION_PERIOD_S
    correction = learn_correction(correction, overloaded=overloaded and at_floor, elapsed_s=elapsed)
    demand = _demand(policy, metrics, correction)
    demand, bursts = _burst(policy, metrics, demand, bursts, now)
    return demand, correction, bursts


def _demand(policy: Policy, m: Metrics, correction: float) -> Demand | None:
    if policy.prefill_tokens_per_s is None or policy.decode_tokens_per_s is None:
        return None  # no tuned profile with both rates: no demand floor
    work = request_work(
        m.mean_prompt_tokens, m.mean_output_tokens, policy.prefill_tokens_per_s,
        policy.decode_tokens_per_s,
    )  # fmt: skip
    work = None if work is None else work * correction
    return demand_floor(
        work_s=work, waiting=m.waiting_requests, arrival_rate=m.arrival_rate,
        arrival_rate_slow=m.arrival_rate_slow, utilization=policy.target_utilization,
        lead_s=policy.lead_s,
    )  # fmt: skip


def _burst(
    policy: Policy, m: Metrics, demand: Demand | None, state: bursts_mod.Bursts, now: float
) -> tuple[Demand | None, bursts_mod.Bursts]:
    """Record this evaluation's fast need and raise the demand to the burst floor while bursts
    recur or one is due (bursts.py). Returns the demand (its `burst` set when the burst floor is
    the larger) and the state to keep."""
    if demand is None or policy.burst_window_s <= 0 or m.arrival_rate_fast is None:
        return demand, state
    fast = m.arrival_rate_fast * demand.work_s
    slow = (m.arrival_rate_slow or 0.0) * demand.work_s
    clump = bursts_mod.clump_need(
        m.arrival_rate_fast, m.mean_prompt_tokens, policy.prefill_tokens_per_s,
        policy.target_ttft_s,
    )  # fmt: skip
    state = bursts_mod.record(
        state, now, fast, slow, policy.burst_window_s, policy.burst_memory_s, clump
    )
    young = bursts_mod.young_need(state, now, policy.burst_window_s, policy.young_margin)
    needs = [
        n
        for n in (
            bursts_mod.burst_need(state),
            bursts_mod.scheduled_need(state, now, policy.lead_s),
            young,
        )
        if n is not None
    ]
    if not needs:
        return demand, state
    need = max(needs)
    replicas = ceil_replicas(need / policy.target_utilization)
    if replicas <= demand.replicas:
        return demand, state
    young_set = young is not None and young >= need
    return dataclasses.replace(demand, replicas=replicas, burst=need, young=young_set), state


def raise_to_floor(
    policy: Policy, m: Metrics, demand: Demand | None, rec: int, reason: str
) -> tuple[int, str, int | None]:
    """Raise the recommendation to the predictive floor: the demand floor, or without it the
    prefill floor (queued prompt tokens against the TTFT budget). Returns (rec, reason, floor)."""
    if demand is not None:  # its backlog term already counts the queue's prefill
        floor = demand.replicas
        why = "BurstFloor" if demand.burst is not None else "DemandFloor"
    else:
        floor = prefill_floor(
            m.queued_prompt_tokens, policy.prefill_tokens_per_s, policy.target_ttft_s,
            m.mean_prompt_tokens,
        )  # fmt: skip
        why = "PrefillFloor"
    if floor is None:
        return rec, reason, None
    floor = policy.clamp(floor)
    return (floor, why, floor) if floor > rec else (rec, reason, floor)
