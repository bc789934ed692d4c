"""Autotuning end to end: the real kopf operator against the emulator, the test playing the Job.

`pagoda tune --quick` runs once per session on the embedded model (a real profile); the test
then does what the Job's `publish` container does, with the same command (`pagoda
publish-profile`, logged in through the kubeconfig instead of the Job's token), and plays the
Job controller by writing the Job's status.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sys
import time
from typing import Any

import pytest
from fake_prometheus import FakePrometheus
from kube_emulator import Emulator
from operator_harness import DEPLOY, wait_for
from operator_helpers import CM, assert_permitted, create_isvc, mark_available
from pagoda.operator.autotune import jobs as jobs_mod
from pagoda.operator.autotune.floor import prefill_floor
from pagoda.operator.autotune.keys import PRODUCT_LABEL
from pagoda.operator.autotune.mount import MOUNT_PATH, VOLUME
from pagoda.operator.autotune.profiles import ATTEMPTS_ANNOTATION
from pagoda.operator.kube.client import KubeApi

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
JOBS, SAS, ROLES = "batch/v1/jobs", "v1/serviceaccounts", "rbac.authorization.k8s.io/v1/roles"
H200, A100 = "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB"
PUBLISH_AGENT = "pagoda-publish-profile/"


@pytest.fixture(scope="session")
def tuned_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One real `pagoda tune --quick` on the embedded model for the whole session."""
    import subprocess

    out = tmp_path_factory.mktemp("tuned")
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "tune", "--model", "smollm2-135m",
           "--quick", "--max-model-len", "256", "--time-budget", "120s", "--output", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


async def add_node(kube: KubeApi, name: str, product: str, gpus: int = 8) -> None:
    labels = {PRODUCT_LABEL: product}
    await kube.request("POST", "/api/v1/nodes", body={"metadata": {"name": name, "labels": labels}})
    await kube.request(
        "PATCH", f"/api/v1/nodes/{name}/status",
        body={"status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip


def spec(**extra: Any) -> dict[str, Any]:
    return {
        "model": "smollm2-135m",
        "resources": {"gpus": 1, "cpu": "2", "memory": "4Gi"},
        "autotune": {"enabled": True, "timeBudgetSeconds": 300},
        **extra,
    }


def autotune(emulator: Emulator, name: str) -> dict[str, Any]:
    body = emulator.live("serving.pagoda.dev/v1alpha1/inferenceservices", "default", name) or {}
    return (body.get("status") or {}).get("autotune") or {}


def tune_jobs(emulator: Emulator) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in emulator.live_all(JOBS)}


async def finish_job(kube: KubeApi, name: str, ok: bool, reason: str = "") -> None:
    """Play the Job controller."""
    cond = {"type": "Complete" if ok else "Failed", "status": "True", "reason": reason or None}
    status = {"conditions": [cond], ("succeeded" if ok else "failed"): 1}
    await kube.patch("Job", "default", name, {"status": status}, subresource="status")


async def publish(tuned: pathlib.Path, configmap: str) -> None:
    """`pagoda publish-profile`, the Job's publish container, as a process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "pagoda.runtime.cli", "publish-profile",
        "--dir", str(tuned), "--configmap", f"default/{configmap}",
        env={**os.environ}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"published" in out


def mounted(emulator: Emulator, name: str) -> str | None:
    d = emulator.live(DEPLOY, "default", name) or {}
    pod = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
    vol = next((v for v in pod.get("volumes") or [] if v["name"] == VOLUME), None)
    return vol["configMap"]["name"] if vol else None


def events(emulator: Emulator, involved: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in emulator.live_all("v1/events")
        if e["involvedObject"]["name"] == involved and e["reason"] == reason
    ]  # fmt: skip


def check_job(job: dict[str, Any], product: str, profile: str) -> None:
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {PRODUCT_LABEL: product}
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 1200
    (tune,), (pub,) = pod["initContainers"], pod["containers"]
    assert tune["resources"]["limits"]["nvidia.com/gpu"] == "1"
    a = tune["args"]
    assert a[a.index("--model") + 1] == "smollm2-135m" and a[a.index("--output") + 1] == "/profile"
    assert a[a.index("--time-budget") + 1] == "300s" and tune["command"] == ["pagoda", "tune"]
    assert pub["args"] == ["--dir", "/profile", "--configmap", f"default/{profile}"]
    # only the publish container holds API credentials
    assert pod["automountServiceAccountToken"] is False
    assert not any(m["name"] == "api-token" for m in tune["volumeMounts"])
    assert any(m["mountPath"] == jobs_mod.TOKEN_DIR for m in pub["volumeMounts"])
    assert pod["serviceAccountName"] == job["metadata"]["name"]


async def test_autotune_jobs_profiles_mounts_failures_and_gc(
    emulator: Emulator, kube: KubeApi, start_operator: Any, tuned_dir: pathlib.Path
) -> None:
    await add_node(kube, "h200-a", H200)
    await add_node(kube, "h200-b", H200)
    await add_node(kube, "a100-a", A100)
    await start_operator(autotune_interval_s=0.2, autotune_retry_base_s=1.5)
    pinned = spec(nodeSelector={PRODUCT_LABEL: H200})
    await create_isvc(kube, "a", pinned)
    await create_isvc(kube, "b", pinned)  # the same key: the same Job, the same profile
    await create_isvc(kube, "c", spec())  # lands on either product: a Job per product

    found = await wait_for(lambda: len(tune_jobs(emulator)) == 2 and tune_jobs(emulator), 15,
                           what="two tuning Jobs")  # fmt: skip
    by_product = {
        j["spec"]["template"]["spec"]["nodeSelector"][PRODUCT_LABEL]: j for j in found.values()
    }
    for name in ("a", "b", "c"):
        await wait_for(lambda n=name: autotune(emulator, n).get("profiles"), what=f"{name} status")
    h200_profile = autotune(emulator, "a")["profile"]
    assert autotune(emulator, "b")["profile"] == h200_profile
    check_job(by_product[H200], H200, h200_profile)
    a100_job = by_product[A100]["metadata"]["name"]
    a100_profile = next(
        p["configMap"] for p in autotune(emulator, "c")["profiles"] if p["product"] == A100
    )
    role = emulator.live(ROLES, "default", by_product[H200]["metadata"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": [h200_profile], "verbs": ["get", "patch"]}]  # fmt: skip
    # serving never waits: the Deployments exist, on defaults, while the Jobs run
    await wait_for(lambda: emulator.live(DEPLOY, "default", "a"), what="deployment a")
    assert mounted(emulator, "a") is None and autotune(emulator, "a")["state"] == "Tuning"

    # the H200 Job publishes its profile: a and b roll to mount it; c (two products) does not
    await publish(tuned_dir, h200_profile)
    await finish_job(kube, by_product[H200]["metadata"]["name"], ok=True)
    for name in ("a", "b"):
        await wait_for(
            lambda n=name: mounted(emulator, n) == h200_profile, 10, what=f"{name} mounts"
        )
    args = emulator.live(DEPLOY, "default", "a")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--tuned-profile") + 1] == MOUNT_PATH
    assert "profile.json" in emulator.live(CM, "default", h200_profile)["data"]
    await wait_for(lambda: autotune(emulator, "a").get("state") == "Tuned", what="Tuned")
    assert events(emulator, "a", "Tuned") and mounted(emulator, "c") is None

    # the A100 Job times out: TuningFailed + a Warning Event, and a retry after the backoff
    t_fail = time.monotonic()
    await finish_job(kube, a100_job, ok=False, reason="DeadlineExceeded")
    await wait_for(lambda: autotune(emulator, "c").get("state") == "TuningFailed", what="failed")
    assert autotune(emulator, "c")["reason"] == "DeadlineExceeded"
    await wait_for(lambda: events(emulator, "c", "TuningFailed"), what="TuningFailed event")
    await wait_for(
        lambda: emulator.live(JOBS, "default", a100_job) is None, what="failed Job deleted"
    )
    retried = await wait_for(lambda: emulator.live(JOBS, "default", a100_job), 10, what="retry")
    assert time.monotonic() - t_fail >= 1.0  # backoff, not a tight loop
    cm = emulator.live(CM, "default", a100_profile)
    assert cm["metadata"]["annotations"][ATTEMPTS_ANNOTATION] == "2" and retried
    await finish_job(kube, a100_job, ok=False, reason="BackoffLimitExceeded")
    await wait_for(lambda: emulator.live(JOBS, "default", a100_job) is None, what="deleted again")
    await asyncio.sleep(2.0)  # second backoff is 3 s: no third Job yet
    assert emulator.live(JOBS, "default", a100_job) is None

    # c goes away: the A100 profile is unused and collected with its Job and RBAC; H200 stays
    await kube.delete("InferenceService", "default", "c")
    await wait_for(lambda: emulator.live(CM, "default", a100_profile) is None, 10, what="GC")
    await wait_for(lambda: emulator.live(SAS, "default", a100_job) is None, what="owned RBAC GC")
    assert emulator.live(CM, "default", h200_profile) is not None

    # a key change re-tunes: b on another max model length gets its own Job; a keeps its profile
    await kube.patch("InferenceService", "default", "b", {"spec": {"engine": {"maxModelLen": 512}}})
    await wait_for(lambda: autotune(emulator, "b").get("profile") not in (None, h200_profile),
                   what="new key")  # fmt: skip
    new_job = autotune(emulator, "b")["profile"].replace("pagoda-tuned-", "pagoda-tune-")
    await wait_for(lambda: emulator.live(JOBS, "default", new_job), what="new Job")
    await wait_for(lambda: mounted(emulator, "b") is None, what="b back on defaults")
    assert mounted(emulator, "a") == h200_profile

    assert_permitted(emulator)
    publisher = {
        (r.method.value, r.resource.plural, r.name)
        for r in emulator._requests
        if r.headers.get("User-Agent", "").startswith(PUBLISH_AGENT) and r.resource
    }
    assert publisher == {("GET", "configmaps", h200_profile), ("PATCH", "configmaps", h200_profile)}


def profile_json(**fields: Any) -> str:
    base = {"schema_version": 1, "device": "NVIDIA H200", "model": "smollm2-135m",
            "dtype": "bfloat16", "created": "2026-12-05T00:00:00Z"}  # fmt: skip
    return json.dumps({**base, **fields})


async def test_a_profile_serving_cannot_use_is_not_mounted(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """A profile ConfigMap that serving would refuse (not JSON, a newer schema: a hand edit or
    another tuner version; or measured for another model) is never mounted: serving exits 2 on a
    profile it cannot load, so the pods would crash-loop. The service stays on defaults with
    TuningFailed naming the cause and no new Job (it would publish the same); a good profile
    mounts, and a bad edit of a mounted one unmounts it."""
    await add_node(kube, "h200-a", H200)
    await start_operator(autotune_interval_s=0.2, autotune_retry_base_s=1.0)
    await create_isvc(kube, "a", spec(nodeSelector={PRODUCT_LABEL: H200}))
    profile = await wait_for(lambda: autotune(emulator, "a").get("profile"), what="profile")
    job = profile.replace("pagoda-tuned-", "pagoda-tune-")
    await wait_for(lambda: emulator.live(JOBS, "default", job), what="job")
    await wait_for(lambda: emulator.live(DEPLOY, "default", "a"), what="deployment")

    async def write(data: str) -> None:
        await kube.patch("ConfigMap", "default", profile, {"data": {"profile.json": data}})

    await write("{not json")
    await finish_job(kube, job, ok=True)
    for data, reason in (
        ("{not json", "InvalidProfile"),
        (profile_json(schema_version=2), "InvalidProfile"),
        (profile_json(model="/mnt/models/another"), "ProfileMismatch"),
    ):
        await write(data)
        st = await wait_for(
            lambda r=reason: autotune(emulator, "a").get("reason") == r and autotune(emulator, "a"),
            what=reason,
        )
        assert st["state"] == "TuningFailed" and profile in st["message"], st
        await asyncio.sleep(0.5)  # a few passes
        assert mounted(emulator, "a") is None
    assert events(emulator, "a", "TuningFailed")[-1]["type"] == "Warning"
    cm = emulator.live(CM, "default", profile)  # no retry loop: still the first attempt
    assert cm["metadata"]["annotations"][ATTEMPTS_ANNOTATION] == "1"

    await write(profile_json())  # fixed by hand: mounted
    await wait_for(lambda: mounted(emulator, "a") == profile, 10, what="mounted")
    assert autotune(emulator, "a")["state"] == "Tuned"
    await write(profile_json(schema_version=2))  # broken again: back to defaults
    await wait_for(lambda: mounted(emulator, "a") is None, 10, what="unmounted")
    await wait_for(lambda: autotune(emulator, "a")["reason"] == "InvalidProfile", what="status")


async def test_retry_bookkeeping_edited_by_hand_or_a_clock_step_stays_bounded(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """The attempt annotations are anyone's to edit, and the wall clock may step back: a failure
    time a day ahead waits one backoff from when it is noticed (not a day), and an attempt count
    of 10^5 or a time of `inf` neither crash the pass (every service's) nor loop."""
    await add_node(kube, "h200-a", H200)
    await start_operator(autotune_interval_s=0.2, autotune_retry_base_s=1.0)
    await create_isvc(kube, "a", spec(nodeSelector={PRODUCT_LABEL: H200}))
    profile = await wait_for(lambda: autotune(emulator, "a").get("profile"), what="profile")
    job = profile.replace("pagoda-tuned-", "pagoda-tune-")
    A = "serving.pagoda.dev/"

    async def fail_and_edit(annotations: dict[str, str]) -> None:
        await wait_for(lambda: emulator.live(JOBS, "default", job), 10, what="a Job")
        await finish_job(kube, job, ok=False, reason="DeadlineExceeded")
        await wait_for(lambda: emulator.live(JOBS, "default", job) is None, what="Job deleted")
        await kube.patch(
            "ConfigMap", "default", profile, {"metadata": {"annotations": annotations}}
        )

    await fail_and_edit({A + "tune-failed": f"{time.time() + 86400:.3f}"})
    t0 = time.monotonic()
    await wait_for(lambda: emulator.live(JOBS, "default", job), 15, what="retried within a backoff")
    assert time.monotonic() - t0 < 10
    cm = emulator.live(CM, "default", profile)
    assert cm["metadata"]["annotations"][ATTEMPTS_ANNOTATION] == "2"

    huge = {A + "tune-attempts": "100000", A + "tune-started": "inf", A + "tune-failed": "inf"}
    await fail_and_edit(huge)
    await wait_for(lambda: emulator.live(JOBS, "default", job), 10, what="a Job after the edit")
    st = await wait_for(
        lambda: "attempt 100001" in autotune(emulator, "a").get("message", "")
        and autotune(emulator, "a"), what="status after the edit",
    )  # fmt: skip
    assert st["state"] == "Tuning"


class PromptAwarePrometheus(FakePrometheus):
    """The fake Prometheus, also answering the mean-prompt-length query of a tuned service."""

    prompt_len = 30.0

    def _value(self, q: str) -> float | None:
        if "prompt_tokens_total" in q:
            return self.prompt_len
        return super()._value(q)


async def test_tuned_service_gets_the_prefill_floor(
    emulator: Emulator, kube: KubeApi, start_operator: Any, tuned_dir: pathlib.Path
) -> None:
    """With V_P from its mounted profile, a queue lifts the replicas past the ×2 step at once."""
    prom = PromptAwarePrometheus()
    await prom.start()
    try:
        await add_node(kube, "h200-a", H200)
        await start_operator(prometheus_url=prom.url, autotune_interval_s=0.2,
                             autoscale_interval_s=0.3, resync_interval_s=300.0)  # fmt: skip
        auto = {"minReplicas": 1, "maxReplicas": 10, "targetTTFTSeconds": 5.0}
        await create_isvc(kube, "fl", spec(nodeSelector={PRODUCT_LABEL: H200}, autoscaling=auto))
        profile = await wait_for(lambda: autotune(emulator, "fl").get("profile"), what="profile")
        await publish(tuned_dir, profile)
        job = profile.replace("pagoda-tuned-", "pagoda-tune-")
        await wait_for(lambda: emulator.live(JOBS, "default", job), what="job")
        await finish_job(kube, job, ok=True)
        await wait_for(lambda: mounted(emulator, "fl") == profile, 10, what="mounted")
        await mark_available(kube, "fl", ready=1)
        prom.ttft, prom.waiting = 6.0, 5000.0  # ratio 1.2: the ×2 cap alone would give 2
        deploy = await wait_for(
            lambda: (emulator.live(DEPLOY, "default", "fl") or {}).get("spec", {}).get("replicas", 0) > 1
            and emulator.live(DEPLOY, "default", "fl"), 10, what="scaled up",
        )  # fmt: skip
        v_p = json.loads(emulator.live(CM, "default", profile)["data"]["profile.json"])["capacity"][
            "prefill_tokens_per_s"
        ]
        assert deploy["spec"]["replicas"] == min(10, prefill_floor(5000 * 30.0, v_p, 5.0, 30.0))

        def last_scale() -> str:
            body = emulator.live("serving.pagoda.dev/v1alpha1/inferenceservices", "default", "fl")
            return ((body.get("status") or {}).get("autoscaling") or {}).get("lastScaleReason", "")

        reason = await wait_for(last_scale, what="status.autoscaling written")
        assert reason.startswith("PrefillFloor"), reason
        assert any("prompt_tokens_total" in q for q in prom.queries)
    finally:
        await prom.stop()
