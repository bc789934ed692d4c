"""An hf:// branch pinned to one commit by the operator (reconcile/model_pin.py), against the
API-server emulator and a local Hub: every pod gets `--revision COMMIT`, status.model shows it,
a push to the branch moves nothing until spec.model or the resolve annotation changes, and a
failed resolution is the Degraded condition."""

from __future__ import annotations

import base64
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


CLOSED = [{"name": "HF_ENDPOINT", "value": "http://127.0.0.1:9"}]  # spec.env wins over the Secret


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"model": "hf://org/missing"}, "(NotFound): hf://org/missing: repository org/missing"),
        ({"model": "hf://org/m@no-such-branch"}, "(NotFound): hf://org/m@no-such-branch: revision"),
        ({"model": "hf://org/m", "env": CLOSED}, "(Unreachable): hf://org/m: cannot reach http://127.0.0.1:9"),
    ],
    ids=["no-repo", "no-branch", "unreachable"],
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
    assert TOKEN not in degraded["message"]
    assert emulator.live(DEPLOY, "default", "bad") is None
