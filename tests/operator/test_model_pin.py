"""An hf:// branch pinned to one commit by the operator (reconcile/model_pin.py), against the
API-server emulator and a local Hub: every pod gets `--revision COMMIT`, status.model shows it,
a push to the branch moves nothing until spec.model or the resolve annotation changes, and a
failed resolution is the Degraded condition. A LoRA adapter's hf:// branch (spec.adapters) alike:
`hf://ORG/NAME@COMMIT` in the `adapter-download` init container, the pin in status.adapters."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from hub_testlib import FakeHub
from kube_emulator import Emulator
from operator_harness import wait_for
from operator_helpers import DEPLOY, ISVC, condition, create_isvc, patch_isvc
from pagoda.operator.kube.client import KubeApi

pytestmark = pytest.mark.e2e
TOKEN = "hf_pin_token"
BASE = {"resources": {"cpu": "1", "memory": "1Gi"}, "modelSecretRef": {"name": "hf"}}


@pytest.fixture
async def hub(kube: KubeApi) -> Any:
    """A private org/m, and the Secret the pods get (the operator reads its token, endpoint)."""
    with FakeHub(token=TOKEN) as h:
        h.add("org/m", {"config.json": b"{}"}, private=True)
        data = {"HF_TOKEN": TOKEN + "\n", "HF_ENDPOINT": h.endpoint}  # a file's newline too
        await kube.create({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "default"},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        })  # fmt: skip
        yield h


def revisions(emulator: Emulator, name: str) -> tuple[str | None, str | None]:
    """The --revision of the model-download init container and of the server container."""
    spec = (emulator.live(DEPLOY, "default", name) or {}).get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    out = []
    for c in (*pod.get("initContainers", ()), *pod.get("containers", ())):
        if c["name"] in ("model-download", "server"):
            args = c["args"]
            out.append(args[args.index("--revision") + 1] if "--revision" in args else None)
    return tuple(out)  # type: ignore[return-value]


def pin(emulator: Emulator, name: str) -> dict[str, Any]:
    return ((emulator.live(ISVC, "default", name) or {}).get("status") or {}).get("model") or {}


async def test_a_branch_is_pinned_once_and_moves_only_when_asked(
    emulator: Emulator, kube: KubeApi, start_operator: Any, hub: FakeHub
) -> None:
    await start_operator(pin_models=True)
    first = hub.repos["org/m"].commit
    await create_isvc(kube, "m", {**BASE, "model": "hf://org/m"})
    await wait_for(lambda: revisions(emulator, "m") == (first, first), what="pinned pods")
    await wait_for(lambda: pin(emulator, "m").get("commit") == first, what="status.model")
    assert pin(emulator, "m")["uri"] == "hf://org/m"

    hub.add("org/m", {"config.json": b'{"v": 2}'}, private=True)  # a push to main
    second = hub.repos["org/m"].commit
    assert second != first
    body = await patch_isvc(kube, "m", {"spec": {"replicas": 2}})  # another spec change
    await wait_for(
        lambda: (emulator.live(ISVC, "default", "m") or {}).get("status", {}).get(
            "observedGeneration") == body["metadata"]["generation"],
        what="replicas reconciled",
    )  # fmt: skip
    assert revisions(emulator, "m") == (first, first)  # the pin holds

    await patch_isvc(kube, "m", {"metadata": {"annotations": {
        "pagoda.dev/resolve-model": "2026-12-06"}}})  # fmt: skip
    await wait_for(lambda: revisions(emulator, "m") == (second, second), what="moved pin")
    await wait_for(lambda: pin(emulator, "m").get("commit") == second, what="status.model")
    assert pin(emulator, "m")["resolveRequest"] == "2026-12-06"
    assert condition(emulator, "m", "Degraded")["reason"] == "AsExpected"


def adapter_uris(emulator: Emulator, name: str) -> list[str]:
    """NAME URI pairs the `adapter-download` init container fetches (after $0, cache, links)."""
    spec = (emulator.live(DEPLOY, "default", name) or {}).get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    init = [c for c in pod.get("initContainers", ()) if c["name"] == "adapter-download"]
    return init[0]["args"][3:] if init else []


def adapter_pins(emulator: Emulator, name: str) -> dict[str, str | None]:
    items = ((emulator.live(ISVC, "default", name) or {}).get("status") or {}).get("adapters")
    return {i["name"]: i.get("commit") for i in items or ()}


async def test_an_adapters_branch_is_pinned_like_the_model(
    emulator: Emulator, kube: KubeApi, start_operator: Any, hub: FakeHub
) -> None:
    """hf://org/lora (main) is fetched as @COMMIT by every pod; a commit, s3:// are as written.
    A push moves nothing until the adapter's source changes (which leaves the model's pin) or
    the resolve annotation does (which moves both)."""
    await start_operator(pin_models=True)
    hub.add("org/lora", {"adapter_config.json": b"{}"}, private=True)
    m1, l1 = hub.repos["org/m"].commit, hub.repos["org/lora"].commit
    adapters = [{"name": "sql", "source": "hf://org/lora"}, {"name": "s3", "source": "s3://bucket/x"},
                {"name": "fixed", "source": f"hf://org/lora@{l1}"}]  # fmt: skip
    await create_isvc(kube, "a", {**BASE, "model": "hf://org/m", "adapters": adapters})
    want = ["sql", f"hf://org/lora@{l1}", "s3", "s3://bucket/x", "fixed", f"hf://org/lora@{l1}"]
    await wait_for(lambda: adapter_uris(emulator, "a") == want, what="pinned adapter")
    await wait_for(lambda: adapter_pins(emulator, "a") == {"sql": l1, "s3": None, "fixed": None})
    item = (emulator.live(ISVC, "default", "a") or {})["status"]["adapters"][0]
    assert item["source"] == "hf://org/lora" and item["resolvedAt"]

    hub.add("org/lora", {"adapter_config.json": b'{"v": 2}'}, private=True)  # pushes to main
    hub.add("org/m", {"config.json": b'{"v": 2}'}, private=True)
    l2, m2 = hub.repos["org/lora"].commit, hub.repos["org/m"].commit
    body = await patch_isvc(kube, "a", {"spec": {"replicas": 2}})
    await wait_for(
        lambda: (emulator.live(ISVC, "default", "a") or {}).get("status", {}).get(
            "observedGeneration") == body["metadata"]["generation"],
        what="replicas reconciled",
    )  # fmt: skip
    assert adapter_uris(emulator, "a") == want and revisions(emulator, "a") == (m1, m1)

    moved = [{**adapters[0], "source": "hf://org/lora@main"}, *adapters[1:]]
    await patch_isvc(kube, "a", {"spec": {"adapters": moved}})  # this adapter's spec changed
    await wait_for(lambda: adapter_uris(emulator, "a")[1] == f"hf://org/lora@{l2}", what="moved")
    assert revisions(emulator, "a") == (m1, m1) and adapter_uris(emulator, "a")[5].endswith(l1)

    hub.add("org/lora", {"adapter_config.json": b'{"v": 3}'}, private=True)
    l3 = hub.repos["org/lora"].commit
    await patch_isvc(kube, "a", {"metadata": {"annotations": {
        "pagoda.dev/resolve-model": "2026-12-07"}}})  # fmt: skip
    await wait_for(lambda: adapter_uris(emulator, "a")[1] == f"hf://org/lora@{l3}", what="re-pin")
    assert revisions(emulator, "a") == (m2, m2)
    await wait_for(lambda: adapter_pins(emulator, "a")["sql"] == l3, what="status.adapters")


def test_recorded_adapter_pins_are_read_back_for_the_current_request() -> None:
    """`recorded_spec` (a restored child, the tuning Job) takes status.adapters' pin only for the
    same name, source and resolve request; otherwise it waits (None) for the full reconcile."""
    from pagoda.operator.children.config_map import build_config_map, config_hash
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.reconcile import model_pin
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

    fields = {"model": "/opt/m", "adapters": [{"name": "sql", "source": "hf://org/lora"}]}
    spec = InferenceServiceSpec.from_dict(fields, name="a", default_image="img:1")
    item = {"name": "sql", "source": "hf://org/lora", "commit": "a" * 40}
    config = OperatorConfig(pin_models=True)
    pinned = model_pin.recorded_spec({"status": {"adapters": [item]}}, spec, config)
    assert (
        pinned is not None and pinned.adapters[0].source.pinned_uri == "hf://org/lora@" + "a" * 40
    )
    for status in ({}, {"adapters": [{**item, "source": "hf://org/lora@v1"}]},
                   {"adapters": [{**item, "name": "other"}]}, {"adapters": [{**item, "commit": "main"}]}):  # fmt: skip
        assert model_pin.recorded_spec({"status": status}, spec, config) is None, status
    asked = {"metadata": {"annotations": {model_pin.RESOLVE_ANNOTATION: "1"}}}
    assert model_pin.recorded_spec({**asked, "status": {"adapters": [item]}}, spec, config) is None
    assert model_pin.recorded_spec({}, spec, OperatorConfig(pin_models=False)) is spec
    assert model_pin.recorded_model_spec({}, spec, config) is spec  # the tuning Job: no adapters
    other = model_pin.pinned(spec, None, {"sql": {**item, "commit": "b" * 40}})
    owner = Owner(name="a", namespace="default", uid="u")
    hashes = {config_hash(build_config_map(owner, s)) for s in (spec, pinned, other)}
    assert len(hashes) == 3  # a new pin rolls the pods


CLOSED = [{"name": "HF_ENDPOINT", "value": "http://127.0.0.1:9"}]  # spec.env wins over the Secret


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"model": "hf://org/missing"}, "(NotFound): hf://org/missing: repository org/missing"),
        ({"model": "hf://org/m@no-such-branch"}, "(NotFound): hf://org/m@no-such-branch: revision"),
        ({"model": "hf://org/m", "env": CLOSED}, "(Unreachable): hf://org/m: cannot reach http://127.0.0.1:9"),
        ({"model": "hf://org/m", "adapters": [{"name": "x", "source": "hf://org/gone"}]},
         "resolve spec.adapters[0] (x) hf://org/gone to a commit (NotFound): hf://org/gone: repository"),
    ],
    ids=["no-repo", "no-branch", "unreachable", "adapter"],
)  # fmt: skip
async def test_a_failed_resolution_is_the_condition_and_leaves_no_pods(
    emulator: Emulator, kube: KubeApi, start_operator: Any, hub: FakeHub, fields: dict, words: str
) -> None:
    await start_operator(pin_models=True)
    await create_isvc(kube, "bad", {**BASE, **fields})
    degraded = await wait_for(
        lambda: (
            (c := condition(emulator, "bad", "Degraded")).get("reason") == "ModelResolveFailed"
            and c
        ),
        what="Degraded ModelResolveFailed",
    )
    assert degraded["status"] == "True" and words in degraded["message"], degraded
    assert ("retrying" in degraded["message"]) == ("Unreachable" in words)
    field = "spec.adapters" if "adapters" in fields else "spec.model"
    assert ("Unreachable" in words) or f"change {field} or the" in degraded["message"]
    assert TOKEN not in degraded["message"]
    assert emulator.live(DEPLOY, "default", "bad") is None


TUNED = {**BASE, "model": "hf://org/m", "resources": {"gpus": 1, "cpu": "1", "memory": "1Gi"},
         "autotune": {"enabled": True}, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}  # fmt: skip


def job_revisions(emulator: Emulator) -> list[tuple[str | None, str | None]]:
    """(model-download's --revision, tune's --revision) of every tuning Job."""
    out = []
    for job in emulator.live_all("batch/v1/jobs"):
        pod = job["spec"]["template"]["spec"]
        found = {}
        for c in pod["initContainers"]:
            args = c["args"]
            found[c["name"]] = args[args.index("--revision") + 1] if "--revision" in args else None
        out.append((found.get("model-download"), found.get("tune")))
    return out


async def test_the_tuning_job_measures_the_commit_the_pods_serve(
    emulator: Emulator, kube: KubeApi, start_operator: Any, hub: FakeHub
) -> None:
    """The operator pins the branch, then its autotune loop renders the tuning Job with the same
    commit in the download init container and in `pagoda tune`; a push to the branch after the
    pin changes neither."""
    from test_autotune_e2e import H200, add_node

    await add_node(kube, "n1", H200)
    await start_operator(pin_models=True, autotune_interval_s=0.1)
    first = hub.repos["org/m"].commit
    await create_isvc(kube, "t", TUNED)
    await wait_for(lambda: revisions(emulator, "t") == (first, first), what="pinned pods")
    hub.add("org/m", {"config.json": b'{"v": 2}'}, private=True)  # a push to main
    await wait_for(lambda: job_revisions(emulator) == [(first, first)], what="pinned tuning Job")


async def test_no_tuning_job_before_the_pin(emulator: Emulator, kube: KubeApi) -> None:
    """An hf:// branch not pinned yet (status.model not written, or a resolve asked again):
    the key waits as TuningPending/ModelNotPinned and starts no Job measuring whatever the
    branch is then; once status.model records the pin, the Job gets it, also when another
    service sharing the key is still unpinned."""
    from pagoda.operator.autotune.loop import Autotuner
    from pagoda.operator.children.model_cache import add_model_download
    from pagoda.operator.reconcile import model_pin
    from pagoda.operator.spec.config import OperatorConfig

    async def reconcile(body: Any) -> None:
        pass

    await create_isvc(kube, "a", TUNED)  # the same key, never pinned here (looked at first)
    await create_isvc(kube, "t", TUNED)
    tuner = Autotuner(kube, OperatorConfig(pin_models=True), reconcile,
                      pod_parts=add_model_download, pin=model_pin.recorded_model_spec)  # fmt: skip
    await tuner.tick()
    st = (emulator.live(ISVC, "default", "t") or {})["status"]["autotune"]
    assert (st["state"], st["reason"]) == ("TuningPending", "ModelNotPinned"), st
    assert "hf://org/m" in st["message"] and job_revisions(emulator) == []

    commit = "c" * 40
    status = {
        "model": {"uri": "hf://org/m", "commit": commit, "resolvedAt": "2026-12-06T00:00:00Z"}
    }
    await kube.patch("InferenceService", "default", "t", {"status": status}, subresource="status")
    await tuner.tick()
    assert job_revisions(emulator) == [(commit, commit)]
    st = (emulator.live(ISVC, "default", "t") or {})["status"]["autotune"]
    assert (st["state"], st["reason"]) == ("Tuning", "JobStarted"), st
    await tuner.tick()  # the shared key's Job runs: the unpinned service reads it too
    st = (emulator.live(ISVC, "default", "a") or {})["status"]["autotune"]
    assert (st["state"], st["reason"]) == ("Tuning", "JobRunning"), st


async def test_the_model_and_adapters_are_asked_at_once_bounded_each_failure_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pin` asks the Hub for the model and every adapter to pin at the same time, at most
    MAX_CONCURRENT_RESOLVES at once (asked one after another, the asks would never meet at the
    barrier); the pins come back in order; several failures are one condition naming each."""
    import threading

    from pagoda.operator.reconcile import model_pin
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

    real, lock, seen = model_pin._model_sha, threading.Lock(), {"now": 0, "most": 0}
    meet = threading.Barrier(3, timeout=10)

    def sha(*args: Any) -> str:
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
        try:
            meet.wait()
            return real(*args)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(model_pin, "MAX_CONCURRENT_RESOLVES", 3)
    monkeypatch.setattr(model_pin, "_model_sha", sha)
    config, body = OperatorConfig(pin_models=True), {"metadata": {"namespace": "default"}}
    with FakeHub() as hub:
        for repo in ("org/m", *(f"org/l{i}" for i in range(5))):
            hub.add(repo, {"config.json": repo.encode()})

        def parse(sources: list[str]) -> InferenceServiceSpec:
            adapters = [{"name": f"a{i}", "source": s} for i, s in enumerate(sources)]
            env = [{"name": "HF_ENDPOINT", "value": hub.endpoint}]
            return InferenceServiceSpec.from_dict(
                {"model": "hf://org/m", "adapters": adapters, "env": env}, name="x",
                default_image="img:1")  # fmt: skip

        spec = parse([f"hf://org/l{i}" for i in range(5)])  # 6 asks: two rounds of 3
        _, found, pins = await model_pin.pin(None, body, spec, config, logging.getLogger())  # type: ignore[arg-type]
        assert found is not None and found["commit"] == hub.repos["org/m"].commit
        assert {n: p["commit"] for n, p in pins.items()} == {
            f"a{i}": hub.repos[f"org/l{i}"].commit for i in range(5)}  # fmt: skip
        assert seen["most"] == 3

        monkeypatch.setattr(model_pin, "_model_sha", real)
        spec = parse(["hf://org/l0", "hf://org/gone", "hf://org/l1", "hf://org/lost"])
        with pytest.raises(model_pin.ModelUnresolved) as e:
            await model_pin.pin(None, body, spec, config, logging.getLogger())  # type: ignore[arg-type]
    message = e.value.message
    assert message.startswith("2 sources could not be resolved: ") and not e.value.transient
    assert "spec.adapters[1] (a1) hf://org/gone to a commit (" in message
    assert "spec.adapters[3] (a3) hf://org/lost to a commit (" in message
    assert "org/l0" not in message and "org/l1" not in message
