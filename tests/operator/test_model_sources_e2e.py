"""hf:// and s3:// end to end through the operator's init container, with no internet:

1. the real operator (main.serve) renders the Deployment against the API-server emulator;
2. its pod template's `model-download` init container runs here as a process (its command, args
   and env, the Secret's keys resolved, each volume a temp dir) against a local Hub / moto S3;
3. the `server` container's command then runs the same way (offline, without the Secret) and
   answers a completion from the downloaded model;
4. failures (404, 401, a full cache) leave the termination message the kubelet would copy into
   the pod's status; fed back through the emulator as the pod's init container status, each
   becomes the InferenceService's condition and a Warning Event, and clears when the pod
   recovers.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from e2e_processes import free_port
from hub_testlib import FakeHub, tiny_checkpoint
from kube_emulator import Emulator
from operator_harness import ROOT, wait_for
from operator_helpers import DEPLOY, condition, create_isvc
from pagoda.operator.kube.client import KubeApi
from pagoda.runtime.termination import parse
from s3_testlib import MotoS3

pytestmark = pytest.mark.e2e
TOKEN = "hf_e2e_token"
BASE = {"resources": {"cpu": "1", "memory": "1Gi"}, "engine": {"maxModelLen": 64}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    return {
        "tiny": tiny_checkpoint(tmp_path_factory.mktemp("tiny")),
        "big": tiny_checkpoint(tmp_path_factory.mktemp("big"), pad_bytes=256 << 10),
    }


@pytest.fixture
def hub(checkpoints: dict[str, pathlib.Path]) -> Any:
    with FakeHub(token=TOKEN) as h:
        h.add_dir("org/tiny", checkpoints["tiny"], private=True)
        h.add_dir("org/big", checkpoints["big"])
        yield h


class Pod:
    """One pod of the rendered Deployment, its containers run as local processes."""

    def __init__(self, deployment: dict[str, Any], root: pathlib.Path, secrets: dict) -> None:
        self.spec = deployment["spec"]["template"]["spec"]
        self.labels = deployment["spec"]["template"]["metadata"]["labels"]
        self.root, self.secrets = root, secrets
        self.volumes = {v["name"]: root / v["name"] for v in self.spec["volumes"]}
        for path in self.volumes.values():
            path.mkdir(parents=True, exist_ok=True)

    def container(self, name: str) -> dict[str, Any]:
        return next(
            c for c in (*self.spec.get("initContainers", []), *self.spec["containers"])
            if c["name"] == name
        )  # fmt: skip

    def _local(self, c: dict[str, Any], text: str) -> str:
        """Container paths under a volume's mountPath → the local folder (one pass)."""
        mounts = {m["mountPath"]: str(self.volumes[m["name"]]) for m in c.get("volumeMounts", [])}
        pattern = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
        return re.sub(rf"^({pattern})(?=/|$)", lambda m: mounts[m.group(1)], text)

    def command(self, name: str) -> tuple[list[str], dict[str, str], pathlib.Path]:
        c = self.container(name)
        assert c["command"][0] == "pagoda"
        argv = [sys.executable, "-P", "-m", "pagoda.runtime.cli", *c["command"][1:], *c["args"]]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "AWS_"))}
        for ref in c.get("envFrom", []):
            env.update(self.secrets[ref["secretRef"]["name"]])
        for e in c.get("env", []):
            assert "value" in e, e  # no other env sources in these containers
            env[e["name"]] = self._local(c, e["value"])
        log = self.root / f"{name}.termination-log"
        log.unlink(missing_ok=True)
        env["PAGODA_TERMINATION_LOG"] = str(log)  # the kubelet's terminationMessagePath
        # argv[0] is this machine's python, never a container path (a checkout under /tmp
        # would otherwise be taken for the /tmp volume)
        return [argv[0], *(self._local(c, a) for a in argv[1:])], env, log

    def run(self, name: str) -> tuple[int, str, str]:
        argv, env, log = self.command(name)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
        return done.returncode, done.stderr, log.read_text() if log.exists() else ""


async def deployment_of(kube: KubeApi, emulator: Emulator, name: str, spec: dict) -> dict:
    await create_isvc(kube, name, spec)
    return await wait_for(lambda: emulator.live(DEPLOY, "default", name), what=f"{name} rendered")


async def report_init_failure(kube: KubeApi, pod: Pod, name: str, message: str) -> None:
    """Play the kubelet: the pod's init container exited 2 and is in CrashLoopBackOff."""
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": pod.labels},
            "spec": pod.spec}  # fmt: skip
    await kube.create(body)
    terminated = {"exitCode": 2, "reason": "Error", "message": message}
    status = {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "model-download", "ready": False, "restartCount": 3,
             "state": {"waiting": {"reason": "CrashLoopBackOff"}},
             "lastState": {"terminated": terminated}},
        ],
        "containerStatuses": [
            {"name": "server", "ready": False, "state": {"waiting": {"reason": "PodInitializing"}}}
        ],
    }  # fmt: skip
    await kube.patch("Pod", "default", name, {"status": status}, subresource="status")


def events(emulator: Emulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in emulator.live_all("v1/events") if e.get("reason") == reason]


@pytest.mark.slow
async def test_hf_model_downloaded_by_the_init_container_then_served_offline(
    emulator: Emulator, kube: KubeApi, start_operator: Any, hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    await start_operator(pin_models=True)  # the operator reads the Secret to pin main
    secrets = {"hf-creds": {"HF_TOKEN": TOKEN, "HF_ENDPOINT": hub.endpoint}}
    await kube.create({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "hf-creds", "namespace": "default"},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in secrets["hf-creds"].items()},
    })  # fmt: skip
    spec = {**BASE, "model": "hf://org/tiny", "modelSecretRef": {"name": "hf-creds"}}
    deployment = await deployment_of(kube, emulator, "tiny", spec)
    pod = Pod(deployment, tmp_path, secrets)
    commit = hub.repos["org/tiny"].commit
    for name in ("model-download", "server"):  # both pinned to the commit main was
        args = pod.container(name)["args"]
        assert args[args.index("--revision") + 1] == commit
    hub.repos["org/tiny"].branches["main"] = "f" * 40  # main moves on: the pods do not

    rc, err, message = pod.run("model-download")
    assert rc == 0, err
    assert f"hf://org/tiny@{commit}: downloading 5 files" in err and message == ""
    cached = list((pod.volumes["model-cache"] / "models--org--tiny" / "snapshots").iterdir())
    assert [c.name for c in cached] == [commit] and (cached[0] / "model.safetensors").is_file()
    hub.requests.clear()

    argv, env, _ = pod.command("server")
    assert "HF_TOKEN" not in env and env["HF_HUB_OFFLINE"] == "1"  # no credentials, no network
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--host") + 1] = "127.0.0.1"
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # were it to try the network, it would fail
    log = open(tmp_path / "server.log", "w+")  # noqa: SIM115
    server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        # while the server starts (it never asks the Hub): a restart of the init container, or
        # a replica's on a shared cache
        rc, err, _ = await asyncio.to_thread(pod.run, "model-download")
        assert rc == 0 and "downloading" not in err and hub.requests == []  # pinned: cached
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            async def ready() -> bool:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                try:
                    return (await http.get("/ready")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(ready, timeout=240, interval=0.5, what="pagoda serve ready")
            r = await http.post(
                "/v1/completions", json={"model": "tiny", "prompt": "w5 w6", "max_tokens": 3}
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3
    finally:
        server.terminate()
        server.wait(30)
        log.close()


@pytest.mark.parametrize(
    ("spec", "secret", "detail", "words"),
    [
        ({"model": "hf://org/missing"}, {"HF_TOKEN": TOKEN}, "NotFound",
         "repository org/missing not found"),
        ({"model": "hf://org/tiny"}, {"HF_TOKEN": "hf_wrong"}, "Unauthorized", "HTTP 401"),
        ({"model": "hf://org/big", "modelCache": {"sizeLimit": "128Ki"}}, {}, "OutOfSpace",
         "size limit"),
    ],
    ids=["404", "401", "full"],
)  # fmt: skip
async def test_a_failed_download_becomes_the_condition(
    emulator: Emulator,
    kube: KubeApi,
    start_operator: Any,
    hub: FakeHub,
    tmp_path: pathlib.Path,
    spec: dict,
    secret: dict,
    detail: str,
    words: str,
) -> None:
    await start_operator()
    spec = {**BASE, **spec, "modelSecretRef": {"name": "creds"}}
    deployment = await deployment_of(kube, emulator, "svc", spec)
    pod = Pod(deployment, tmp_path, {"creds": {"HF_ENDPOINT": hub.endpoint, **secret}})
    rc, err, message = pod.run("model-download")
    assert rc == 2 and err.strip().splitlines()[-1].startswith("pagoda download: error: ")
    parsed = parse(message)
    assert (parsed.reason, parsed.detail) == ("ModelDownloadFailed", detail), message
    assert words in parsed.message, message

    await report_init_failure(kube, pod, "svc-7d9f-abcde", message)
    ready = await wait_for(
        lambda: (
            (c := condition(emulator, "svc", "Ready")).get("reason") == "ModelDownloadFailed" and c
        ),
        what="Ready=False ModelDownloadFailed",
    )
    assert ready["status"] == "False"
    assert ready["message"].startswith(f"{detail}: ") and words in ready["message"]
    assert "init container model-download" in ready["message"]
    degraded = condition(emulator, "svc", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ModelDownloadFailed")
    (event,) = await wait_for(lambda: events(emulator, "ModelDownloadFailed"), what="the Event")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "svc"

    # the cause is fixed and the pod starts: the condition clears (no new Event)
    status = {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": "model-download", "ready": True, "restartCount": 4,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
             "lastState": {"terminated": {"exitCode": 2, "message": message}}},
        ],
        "containerStatuses": [{"name": "server", "ready": False, "state": {"running": {}}}],
    }  # fmt: skip
    await kube.patch("Pod", "default", "svc-7d9f-abcde", {"status": status}, subresource="status")
    await wait_for(
        lambda: condition(emulator, "svc", "Degraded").get("reason") == "AsExpected",
        what="Degraded cleared",
    )
    assert condition(emulator, "svc", "Ready")["reason"] == "Unavailable"
    await asyncio.sleep(0.2)
    assert len(events(emulator, "ModelDownloadFailed")) == 1


async def test_s3_model_through_the_init_container(
    emulator: Emulator,
    kube: KubeApi,
    start_operator: Any,
    checkpoints: dict[str, pathlib.Path],
    tmp_path: pathlib.Path,
) -> None:
    s3 = MotoS3().start()
    try:
        s3.upload_dir("models", "tiny", checkpoints["tiny"])
        await start_operator()
        spec = {**BASE, "model": "s3://models/tiny", "modelSecretRef": {"name": "s3-creds"}}
        deployment = await deployment_of(kube, emulator, "from-s3", spec)
        pod = Pod(deployment, tmp_path, {"s3-creds": dict(s3.env)})
        with s3.require_auth():
            rc, err, _ = pod.run("model-download")
            assert rc == 0, err
            pod.secrets["s3-creds"]["AWS_SECRET_ACCESS_KEY"] = "wrong"
            (pod.volumes["model-cache"] / "s3").rename(tmp_path / "kept")  # a fresh pod's cache
            rc, _, message = pod.run("model-download")
        assert rc == 2 and parse(message).detail == "Unauthorized", message
        await report_init_failure(kube, pod, "from-s3-5c4b-xyz12", message)
        await wait_for(
            lambda: condition(emulator, "from-s3", "Ready").get("reason") == "ModelDownloadFailed",
            what="Ready=False ModelDownloadFailed",
        )
        assert (
            "Unauthorized: s3://models/tiny" in condition(emulator, "from-s3", "Ready")["message"]
        )
    finally:
        s3.stop()
