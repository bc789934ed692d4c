"""A GPU product label that blinks (GPU feature discovery restarting, a node relabelled, a node
pool scaled to zero): the autotune loop against the emulator, one pass at a time on a test clock.
A blink must neither unmount nor delete a good profile, nor start a tuning Job for a GPU type
that is not there; a GPU type whose profile exists is never tuned again."""

from __future__ import annotations

from typing import Any

import pytest
from crd_schema import validate
from kube_emulator import Emulator
from operator_harness import load_crd
from operator_helpers import CM, create_isvc
from pagoda.operator.autotune.keys import PRODUCT_LABEL
from pagoda.operator.autotune.loop import Autotuner
from pagoda.operator.autotune.profiles import ATTEMPTS_ANNOTATION
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.spec.config import OperatorConfig
from test_autotune_e2e import A100, H200, JOBS, add_node, autotune, finish_job, profile_json, spec

GRACE = 300.0


async def relabel(kube: KubeApi, node: str, product: str | None) -> None:
    await kube.request(
        "PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"labels": {PRODUCT_LABEL: product}}},
        content_type="application/merge-patch+json",
    )  # fmt: skip


def decided(st: dict[str, Any]) -> dict[str, Any]:
    """status.autotune but the products' memory (nodeProducts)."""
    return {k: v for k, v in st.items() if k != "nodeProducts"}


def jobs_for(emulator: Emulator) -> dict[str, str]:
    return {
        j["spec"]["template"]["spec"]["nodeSelector"][PRODUCT_LABEL]: j["metadata"]["name"]
        for j in emulator.live_all(JOBS)
    }


async def test_a_gpu_label_blink_keeps_the_profile_and_starts_no_job(
    emulator: Emulator, kube: KubeApi
) -> None:
    await add_node(kube, "n1", H200)
    await create_isvc(kube, "c", spec())  # not pinned: its products come from the nodes
    reconciled: list[str] = []

    async def reconcile(body: Any) -> None:
        reconciled.append(body["metadata"]["name"])

    tuner = Autotuner(kube, OperatorConfig(autotune_product_grace_s=GRACE), reconcile)
    now = [1_000_000.0]
    tuner.clock = lambda: now[0]

    async def tick(dt: float = 15.0) -> dict[str, Any]:
        now[0] += dt
        await tuner.tick()
        return autotune(emulator, "c")

    st = await tick()
    assert (st["state"], st["product"]) == ("Tuning", H200) and set(jobs_for(emulator)) == {H200}
    profile = st["profile"]
    await kube.patch("ConfigMap", "default", profile, {"data": {"profile.json": profile_json()}})
    await finish_job(kube, jobs_for(emulator)[H200], ok=True)
    tuned = await tick()
    assert tuned["state"] == "Tuned", tuned
    before = len(reconciled)

    # blinks shorter than the grace: the label gone, then another product for a pass, then back
    for label in (None, A100, H200):
        await relabel(kube, "n1", label)
        assert decided(await tick()) == decided(tuned), label  # nothing unmounted, no new product
        assert set(jobs_for(emulator)) <= {H200}, label  # no Job for a GPU type not there
        assert emulator.live(CM, "default", profile) is not None
    assert len(reconciled) == before  # no rollout either way

    # the node pool gone for longer than the grace (scaled to zero): the service says so, but
    # the good profile stays, and when the nodes come back it is mounted again, not re-tuned
    await relabel(kube, "n1", None)
    await tick()
    gone = await tick(GRACE)
    assert gone["reason"] == "NoGPUNodes", gone
    assert emulator.live(CM, "default", profile)["data"]["profile.json"]
    await relabel(kube, "n1", H200)
    back = await tick()
    assert (back["state"], back["profile"]) == ("Tuned", profile), back
    annotations = emulator.live(CM, "default", profile)["metadata"]["annotations"]
    assert annotations[ATTEMPTS_ANNOTATION] == "1" and set(jobs_for(emulator)) <= {H200}

    # a GPU type that really joins counts once it has stayed for the grace
    await add_node(kube, "n2", A100)
    assert (await tick())["product"] == H200 and A100 not in jobs_for(emulator)
    both = await tick(GRACE)
    assert {p["product"] for p in both["profiles"]} == {H200, A100}
    assert A100 in jobs_for(emulator)

    # the service goes: its profiles are collected
    await kube.delete("InferenceService", "default", "c")
    await tick()
    assert emulator.live(CM, "default", profile) is None


@pytest.mark.parametrize("take_over_after", [None, 2, 3])
async def test_a_take_over_during_a_blink_decides_as_without_it(
    emulator: Emulator, kube: KubeApi, take_over_after: int | None
) -> None:
    """The products' memory is saved in status.autotune.nodeProducts: an operator that takes
    over (a fresh Autotuner: another replica, a restart) reads it back, so a blink that spans
    the take-over is still a blink (no Job for a GPU type that is not there, the profile stays
    mounted), and the grace ends at the same pass as without the take-over. Without it the new
    process took the products of its first pass: NoGPUNodes, or a Job for the blinked one."""
    await add_node(kube, "n1", H200)
    await create_isvc(kube, "c", spec())
    config = OperatorConfig(autotune_product_grace_s=GRACE)  # passes every 15 s (the interval)
    now = [1_000_000.0]

    def tuner() -> Autotuner:
        async def reconcile(body: Any) -> None:
            pass

        made = Autotuner(kube, config, reconcile)
        made.clock = lambda: now[0]
        return made

    current, passes, crd = tuner(), 0, load_crd()

    async def tick(dt: float = config.autotune_interval_s) -> dict[str, Any]:
        nonlocal current, passes
        if passes == take_over_after:
            current = tuner()  # its first pass, one interval after the last one's
        passes += 1
        now[0] += dt
        await current.tick()
        body = emulator.live("serving.pagoda.dev/v1alpha1/inferenceservices", "default", "c")
        assert not validate(crd, body), validate(crd, body)  # the CRD keeps it (no pruning)
        return autotune(emulator, "c")

    st = await tick()
    await kube.patch("ConfigMap", "default", st["profile"],
                     {"data": {"profile.json": profile_json()}})  # fmt: skip
    await finish_job(kube, jobs_for(emulator)[H200], ok=True)
    tuned = await tick()  # pass 2: the nodes show H200
    assert tuned["state"] == "Tuned" and tuned["nodeProducts"]["inUse"] == [{"product": H200}]

    for label in (None, A100, None):  # passes 3-5: a blink, another product for a pass
        await relabel(kube, "n1", label)
        assert decided(await tick()) == decided(tuned), label
        assert set(jobs_for(emulator)) <= {H200}, label
    # the grace runs out 300 s after pass 2, at the same pass either way
    assert decided(await tick(GRACE - 3 * config.autotune_interval_s)) == decided(tuned)
    assert (await tick())["reason"] == "NoGPUNodes"


@pytest.mark.parametrize("away", [200.0, 3600.0])
async def test_a_product_gone_while_every_replica_was_down_ends_its_grace_on_time(
    emulator: Emulator, kube: KubeApi, away: float
) -> None:
    """Every replica down after pass 2; meanwhile the H200 nodes become A100 ones. The restarted
    operator holds H200 until its grace from the last pass that saw it ends, as a running one
    would have, to within the refresh of the saved `checked` (a tenth of the grace, 30 s), then
    takes A100 at once (nothing left in use). Before, the saved pass was taken to be one
    interval before the restart: H200 was held for the whole grace after it (an hour's outage
    still kept the profile mounted and no Job started for A100 for 5 minutes)."""
    await add_node(kube, "n1", H200)
    await create_isvc(kube, "c", spec())
    config = OperatorConfig(autotune_product_grace_s=GRACE)
    now = [1_000_000.0]

    def tuner() -> Autotuner:
        async def reconcile(body: Any) -> None:
            pass

        made = Autotuner(kube, config, reconcile)
        made.clock = lambda: now[0]
        return made

    first = tuner()
    for _ in range(2):  # pass 1: a Job for H200; pass 2: tuned
        now[0] += config.autotune_interval_s
        await first.tick()
        if _ == 0:
            st = autotune(emulator, "c")
            await kube.patch("ConfigMap", "default", st["profile"],
                             {"data": {"profile.json": profile_json()}})  # fmt: skip
            await finish_job(kube, jobs_for(emulator)[H200], ok=True)
    last_pass = now[0]
    assert autotune(emulator, "c")["product"] == H200
    await relabel(kube, "n1", A100)  # while no operator runs
    now[0] += away - config.autotune_interval_s
    restarted = tuner()
    while True:
        now[0] += config.autotune_interval_s
        await restarted.tick()
        st = autotune(emulator, "c")
        if st.get("product") != H200:
            break
        assert now[0] - last_pass <= GRACE + GRACE / 10 + config.autotune_interval_s, st
    assert now[0] - last_pass > GRACE or away > GRACE  # never before its grace ended
    assert now[0] - last_pass <= max(away, GRACE + GRACE / 10 + config.autotune_interval_s)
    assert st["product"] == A100 and A100 in jobs_for(emulator), st
