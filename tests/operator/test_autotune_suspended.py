"""A tuning Job held suspended (`spec.suspend: true`, as Kueue creates Jobs until it admits them):
the autotune loop against the emulator reports it as pending with the reason, not as running."""

from __future__ import annotations

from typing import Any

from kube_emulator import Emulator
from operator_helpers import create_isvc
from pagoda.operator.autotune import jobs
from pagoda.operator.autotune.keys import PRODUCT_LABEL
from pagoda.operator.autotune.loop import Autotuner
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.config import OperatorConfig
from test_autotune_e2e import H200, JOBS, add_node, autotune, spec


def test_job_outcome_of_a_suspended_job() -> None:
    suspended = {
        "spec": {"suspend": True},
        "status": {"conditions": [{"type": "Suspended", "status": "True",
                                   "reason": "JobSuspended", "message": "Job suspended"}]},
    }  # fmt: skip
    outcome, reason, message = jobs.job_outcome(suspended)
    assert (outcome, reason) == ("suspended", "JobSuspended") and "Kueue" in message
    assert jobs.job_outcome({"spec": {"suspend": True}})[0] == "suspended"  # no status yet
    assert jobs.job_outcome({"spec": {"suspend": False}, "status": {"active": 1}})[0] == "running"


async def test_a_suspended_tuning_job_reads_as_pending(emulator: Emulator, kube: KubeApi) -> None:
    await add_node(kube, "n1", H200)
    await create_isvc(kube, "a", spec(nodeSelector={PRODUCT_LABEL: H200}))
    reconciled: list[Any] = []

    async def reconcile(body: Any) -> None:
        reconciled.append(body)

    tuner = Autotuner(kube, OperatorConfig(), reconcile)
    await tuner.tick()
    (job,) = emulator.live_all(JOBS)
    name = job["metadata"]["name"]
    assert autotune(emulator, "a")["reason"] == "JobStarted"

    await kube.patch("Job", "default", name, {"spec": {"suspend": True}})  # Kueue's hold
    await tuner.tick()
    st = autotune(emulator, "a")
    assert (st["state"], st["reason"]) == ("TuningPending", "JobSuspended"), st
    assert name in st["message"] and "suspended" in st["message"]
    assert st["profiles"][0]["state"] == "TuningPending"
    assert len(list(emulator.live_all(JOBS))) == 1  # the same Job waits: no retry, no second one

    await kube.patch("Job", "default", name, {"spec": {"suspend": False}})  # admitted
    await tuner.tick()
    st = autotune(emulator, "a")
    assert (st["state"], st["reason"]) == ("Tuning", "JobRunning"), st
