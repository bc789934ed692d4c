"""The user's flow with the real kubectl binary: apply the example, get, scale, delete."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import shutil
from typing import Any

import pytest
from kube_emulator import Emulator
from operator_harness import DEPLOY, ISVC, ROOT, wait_for
from operator_helpers import children, condition, mark_available
from pagoda.operator.kube.client import KubeApi

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("kubectl") is None and os.environ.get("PAGODA_REQUIRE_E2E") != "1",
        reason="kubectl not installed",
    ),
]


async def kubectl(emulator: Emulator, *args: str, check: bool = True) -> str:
    cache = pathlib.Path(emulator.kubeconfig).parent / "kube-cache"
    proc = await asyncio.create_subprocess_exec(
        "kubectl", f"--kubeconfig={emulator.kubeconfig}", f"--cache-dir={cache}", "--request-timeout=10s", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{out.decode()}{err.decode()}"
        )
    assert "Warning" not in err.decode(), (
        err.decode()
    )  # e.g. discovery the way a real server answers it
    return out.decode() + err.decode()


def table(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()]


async def test_kubectl_apply_get_scale_delete(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    await start_operator()
    out = await kubectl(
        emulator, "apply", "--validate=false", "-f", str(ROOT / "examples/smollm2-cpu.yaml")
    )
    assert "inferenceservice.serving.pagoda.dev/smollm2 created" in out
    await wait_for(lambda: all(children(emulator, "smollm2").values()), what="children")
    await mark_available(kube, "smollm2")
    await wait_for(
        lambda: condition(emulator, "smollm2", "Ready").get("status") == "True", what="Ready"
    )

    header, row = table(await kubectl(emulator, "get", "isvc"))
    assert header == ["NAME", "READY", "REPLICAS", "MODEL", "URL", "AGE"]
    assert row[:5] == [
        "smollm2",
        "True",
        "1",
        "smollm2-135m",
        "http://smollm2.default.svc.cluster.local:8000/v1",
    ]
    assert re.fullmatch(r"\d+[smhd]", row[5]), row
    header, row = table(
        await kubectl(
            emulator, "get", "inferenceservices.serving.pagoda.dev", "smollm2", "-o", "wide"
        )
    )
    # TUNING (the autotune column) is empty without spec.autotune: no cell in the split row
    assert header[-3:] == ["AVAILABLE", "REASON", "TUNING"] and row[-2:] == ["1", "AsExpected"]

    out = await kubectl(emulator, "scale", "isvc/smollm2", "--replicas=3")
    assert "scaled" in out
    await wait_for(
        lambda: emulator.live(DEPLOY, "default", "smollm2")["spec"]["replicas"] == 3,
        what="3 replicas",
    )
    await wait_for(
        lambda: emulator.live("policy/v1/poddisruptionbudgets", "default", "smollm2"), what="PDB"
    )
    assert emulator.live(ISVC, "default", "smollm2")["spec"]["replicas"] == 3

    await kubectl(emulator, "delete", "isvc", "smollm2", "--wait=false")
    await wait_for(lambda: not any(children(emulator, "smollm2").values()), what="children gone")
    assert "No resources found" in await kubectl(emulator, "get", "isvc")


async def test_kubectl_invalid_example_gets_degraded(
    emulator: Emulator, kube: KubeApi, start_operator: Any
) -> None:
    """Without the API server's schema (the emulator has none) the operator still refuses it."""
    await start_operator()
    await kubectl(
        emulator,
        "apply",
        "--validate=false",
        "-f",
        str(ROOT / "examples/invalid/min-greater-than-max.yaml"),
    )
    await wait_for(
        lambda: condition(emulator, "bad-autoscaling", "Degraded").get("status") == "True",
        what="Degraded",
    )
    degraded = condition(emulator, "bad-autoscaling", "Degraded")
    assert (
        degraded["reason"] == "InvalidSpec"
        and "minReplicas (5) must be <= maxReplicas (2)" in degraded["message"]
    )
    _, row = table(await kubectl(emulator, "get", "isvc", "bad-autoscaling", "-o", "wide"))
    assert row[1] == "False" and row[-1] == "InvalidSpec"
    events = await kubectl(
        emulator, "get", "events", "-o", "custom-columns=REASON:.reason,OBJECT:.involvedObject.name"
    )
    assert re.search(r"InvalidSpec\s+bad-autoscaling", events), events
