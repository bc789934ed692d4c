"""The autoscaler keeps each service's decision state between evaluations (loop.py's _State): the
history, the learned correction and the burst floor's samples go back into the next decide(), so
a service whose bursts recur is held at their need in the quiet between them. A fake Kubernetes
API stands in for the cluster (the loop against the emulator is test_autoscale_loop.py)."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from pagoda.operator.autoscaling.loop import Autoscaler
from pagoda.operator.autoscaling.policy import Metrics, Policy
from pagoda.operator.spec.config import OperatorConfig
from pagoda.operator.web.metrics import OperatorMetrics

POLICY = Policy(
    min_replicas=1, max_replicas=40, target_ttft_s=5.0, down_window_s=10,
    prefill_tokens_per_s=1000.0, decode_tokens_per_s=500.0, lead_s=0.0, target_utilization=0.95,
    young_margin=1.0,  # the recurring bursts' floor alone
)  # fmt: skip


class Api:
    """Patches land on the in-memory Deployment; everything is ready at once."""

    def __init__(self) -> None:
        self.replicas = 2

    async def patch(self, kind: str, ns: str, name: str, body: dict, **kw: Any) -> dict:
        if kind == "Deployment":
            self.replicas = body["spec"]["replicas"]
        return {}

    async def try_post_event(self, *a: Any, **kw: Any) -> None:
        return None

    def deployment(self) -> dict[str, Any]:
        meta = {"namespace": "default", "name": "chat"}
        return {"metadata": meta, "spec": {"replicas": self.replicas},
                "status": {"readyReplicas": self.replicas}}  # fmt: skip


def reading(fast: float, slow: float) -> Metrics:
    return Metrics(
        ttft_p95_s=0.1, waiting=0.0, mean_prompt_tokens=100.0, mean_output_tokens=50.0,
        arrival_rate=fast, arrival_rate_slow=slow, arrival_rate_fast=fast,
    )  # fmt: skip


def test_the_burst_samples_carry_over_between_evaluations() -> None:
    api, clock = Api(), [0.0]
    scaler = Autoscaler(api, OperatorConfig(), OperatorMetrics(), clock=lambda: clock[0])  # type: ignore[arg-type]
    fresh = {"metadata": {"namespace": "default", "name": "chat", "uid": "u1"}}
    quiet, burst = reading(1.0, 1.0), reading(40.0, 4.0)

    async def run() -> list[tuple[int, str]]:
        out = []
        for m in [quiet] * 3 + [burst] * 2 + [quiet] * 4 + [burst] * 2 + [quiet] * 6:
            clock[0] += 5.0
            d = await scaler._decide_and_apply(
                POLICY, fresh, api.deployment(), m, ("", ""), logging.getLogger("test")
            )
            out.append((d.replicas, d.reason))
        return out

    out = asyncio.run(run())
    need = math.ceil(40 * 0.2 / POLICY.target_utilization)  # 8 replicas busy in a burst
    assert out[-1] == (need, "BurstFloor"), out  # the quiet after the second burst stays up
    assert len(scaler._states["u1"].bursts.samples) == len(out)
