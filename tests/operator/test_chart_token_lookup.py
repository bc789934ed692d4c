"""The chart's webhook token Secret keeps its token across upgrades: templates/webhook-secret.yaml
`lookup`s the live Secret and reuses its value (Helm's documented pattern), so Alertmanager's copy
stays valid; only a first install (or a Secret without the key) draws a new one. Rendered by
Helm's own Go SDK (helm-python-sdk) against the API-server emulator, which is what `helm
install/upgrade` do; offline (`helm template`, `--dry-run=client`) lookup finds nothing and every
render draws a fresh token."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import helm_python as helm
import yaml
from operator_harness import ROOT
from pagoda.operator.kube.client import KubeApi

NAMESPACE = "default"
SECRET = "pagoda-webhook"
VALUES = {"webhook": {"tokenSecret": {"create": True}}}


def _secret(manifests: dict[str, str]) -> dict[str, Any]:
    return yaml.safe_load(manifests["pagoda/templates/webhook-secret.yaml"])


async def test_upgrade_keeps_the_live_token(emulator: Any, kube: KubeApi) -> None:
    chart = helm.Chart.load(str(ROOT / "charts" / "pagoda"))
    config = helm.Config(kubeconfig_path=str(emulator.kubeconfig), namespace=NAMESPACE)

    async def render(upgrade: bool, values: dict[str, Any] = VALUES) -> dict[str, Any]:
        manifests = await asyncio.to_thread(
            config.render, chart, values, name="pagoda", namespace=NAMESPACE,
            is_install=not upgrade, is_upgrade=upgrade,
        )  # fmt: skip
        return _secret(manifests)

    first = await render(upgrade=False)
    assert first["metadata"]["name"] == SECRET
    token = first["data"]["token"]
    assert len(base64.b64decode(token)) == 32
    await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body=first)
    for _ in range(2):
        assert (await render(upgrade=True))["data"]["token"] == token
    # offline, as `helm template` renders: no cluster, no live Secret, a new token every time
    offline = chart.render(VALUES, name="pagoda", namespace=NAMESPACE, is_install=True)
    assert _secret(offline)["data"]["token"] != token
    # a key the live Secret lacks is drawn anew (and the old key is not carried over)
    other = {"webhook": {"tokenSecret": {"create": True, "key": "bearer"}}}
    data = (await render(upgrade=True, values=other))["data"]
    assert set(data) == {"bearer"} and data["bearer"] != token
