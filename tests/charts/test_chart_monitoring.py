"""Monitoring pieces of the chart: the runtime/operator ServiceMonitors, the plain Prometheus
scrape example, the Alertmanager route to the operator's webhook, and which value sets render
them. Alert rules: test_chart_alert_rules.py; the Grafana dashboard and the metric names:
test_chart_dashboard.py."""

from __future__ import annotations

import copy
import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml
from chart_helpers import (
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    of_kind,
    one,
    operator_container,
    operator_service,
    render,
    render_cached,
    require_tool,
)
from monitoring_helpers import (
    FILES,
    RULES_FILE,
    relabel_targets,
)
from pagoda.operator.children.monitoring import build_service_monitor
from pagoda.operator.children.owner import Owner
from pagoda.operator.children.service import build_service
from pagoda.operator.kube import names

# --- scraping --------------------------------------------------------------------------------


def test_runtime_service_monitor_selects_operator_built_services_and_adds_keys() -> None:
    docs = render_cached("monitoring")
    monitor = one(docs, "ServiceMonitor", f"{RELEASE}-runtime")
    selector = monitor["spec"]["selector"]["matchLabels"]
    service = build_service(Owner(name="llama", namespace="team-a", uid="u"))
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    targets = relabel_targets(endpoint["relabelings"], "sourceLabels", "targetLabel")
    assert targets["namespace"] == "__meta_kubernetes_namespace"
    instance = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", names.LABEL_INSTANCE)
    assert targets["inferenceservice"] == instance
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    namespaced = one(render_cached("namespaced-monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}


def scraped_services(docs: Any, monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The Services of the release namespace a ServiceMonitor's selector picks."""
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    return [s for s in of_kind(docs, "Service") if wanted <= s["metadata"]["labels"].items()]


@pytest.mark.parametrize("value_set", ["monitoring", "ha-namespaced-tls"])
def test_operator_service_monitor_scrapes_every_operator_pod(value_set: str) -> None:
    """Through a headless Service of every operator pod, not the operator Service (with several
    replicas that one selects the active pod only): a standby's /metrics, its
    pagoda_operator_peering_active 0, reaches Prometheus too."""
    docs = render_cached(value_set)
    monitor = one(docs, "ServiceMonitor", f"{RELEASE}-operator")
    (service,) = scraped_services(docs, monitor)
    assert service["metadata"]["name"] == f"{RELEASE}-metrics"
    assert service["spec"]["clusterIP"] == "None"  # endpoints: the pods themselves
    deployment = one(docs, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"]
    container_ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port["targetPort"] in {p["name"] for p in container_ports}
    for doc in of_kind(docs, "ServiceMonitor") + of_kind(docs, "PrometheusRule"):
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert of_kind(render_cached("ha"), "ServiceMonitor") == []  # only when asked for
    assert [s["metadata"]["name"] for s in of_kind(render_cached("ha"), "Service")] == [
        f"{RELEASE}-operator"
    ]


def test_plain_prometheus_scrape_example(tmp_path: pathlib.Path) -> None:
    """Same relabeling as the ServiceMonitor; promtool accepts the config. (Debian's promtool is
    built without Kubernetes service discovery, so it is checked with static targets there.)"""
    example = yaml.safe_load((FILES / "prometheus-scrape-example.yaml").read_text())
    (job,) = example["scrape_configs"]
    targets = relabel_targets(job["relabel_configs"], "source_labels", "target_label")
    monitor = one(render_cached("monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert targets == relabel_targets(endpoint["relabelings"], "sourceLabels", "targetLabel")
    (tmp_path / "prometheus-rules.yaml").write_text(RULES_FILE.read_text())
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(example))
    tool = require_tool("promtool")
    result = subprocess.run(
        [tool, "check", "config", "prometheus.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        static = copy.deepcopy(example)
        del static["scrape_configs"][0]["kubernetes_sd_configs"]
        static["scrape_configs"][0]["static_configs"] = [{"targets": ["127.0.0.1:8000"]}]
        (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(static))
        result = subprocess.run(
            [tool, "check", "config", "prometheus.yaml"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 3 rules found" in result.stdout


# --- Alertmanager -----------------------------------------------------------------------------


def test_alertmanager_config_routes_scale_up_alerts_to_the_operator_webhook() -> None:
    docs = render_cached("monitoring")
    config = one(docs, "AlertmanagerConfig")
    service = operator_service(docs)
    port = service["spec"]["ports"][0]["port"]
    route = config["spec"]["route"]
    assert route["matchers"] == [{"name": "pagoda_action", "matchType": "=", "value": "scale_up"}]
    assert {"namespace", "inferenceservice"} <= set(route["groupBy"])
    (receiver,) = config["spec"]["receivers"]
    assert receiver["name"] == route["receiver"]
    (hook,) = receiver["webhookConfigs"]
    assert hook["url"] == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{port}/alerts"
    assert hook["sendResolved"] is True
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    secret_ref = env["PAGODA_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]
    auth = hook["httpConfig"]["authorization"]
    assert auth == {"type": "Bearer", "credentials": secret_ref}
    without_token = render({"monitoring": {"alertmanagerConfig": {"enabled": True}}})
    (hook,) = one(without_token, "AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"]
    assert "httpConfig" not in hook


def test_alertmanager_example_file(tmp_path: pathlib.Path) -> None:
    example = yaml.safe_load((FILES / "alertmanager-example.yaml").read_text())
    routes = [r for r in example["route"]["routes"] if 'pagoda_action="scale_up"' in r["matchers"]]
    assert len(routes) == 1
    receiver = next(r for r in example["receivers"] if r["name"] == routes[0]["receiver"])
    (hook,) = receiver["webhook_configs"]
    default = render_cached("defaults")
    service = operator_service(default)
    assert hook["url"] == (
        f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}/alerts"
    )
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    (tmp_path / "token").write_text("secret\n")
    hook["http_config"]["authorization"]["credentials_file"] = str(tmp_path / "token")
    (tmp_path / "alertmanager.yaml").write_text(yaml.safe_dump(example))
    result = subprocess.run(
        [require_tool("amtool"), "check-config", "alertmanager.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_value_sets_render_monitoring_only_when_enabled() -> None:
    kinds = {d["kind"] for d in render_cached("defaults")}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig", "ConfigMap"}
    assert VALUE_SETS["monitoring"]["monitoring"]["prometheusRule"]["enabled"] is True


def test_operator_built_service_monitor_adds_the_same_labels() -> None:
    chart = one(render_cached("monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    (chart_endpoint,) = chart["spec"]["endpoints"]
    built = build_service_monitor(Owner(name="llama", namespace="team-a", uid="u"))
    (endpoint,) = built["spec"]["endpoints"]
    expected = relabel_targets(chart_endpoint["relabelings"], "sourceLabels", "targetLabel")
    got = relabel_targets(endpoint.get("relabelings", []), "sourceLabels", "targetLabel")
    assert {k: got.get(k) for k in ("namespace", "inferenceservice")} == {
        k: expected[k] for k in ("namespace", "inferenceservice")
    }
