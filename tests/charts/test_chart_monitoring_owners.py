"""One owner per monitoring concern: for every combination of the chart's runtime ServiceMonitor
and PrometheusRule, the chart plus the children the operator (run with the chart's own args)
builds for one autoscaled InferenceService give exactly one ServiceMonitor over its pods and
each alert once, all of them with `monitoring.labels`. A Prometheus that selects every ServiceMonitor would otherwise scrape each pod
twice, and two PrometheusRules would evaluate every alert twice (the lower TTFT threshold
firing the scale-up step)."""

from __future__ import annotations

import argparse
import collections
import pathlib
from typing import Any

import pytest
import yaml
from chart_helpers import MONITORING_ON, NAMESPACE, of_kind, operator_container, render
from monitoring_helpers import alerts_by_name
from monitoring_helpers import rules as monitoring_rules
from pagoda.operator import main as operator_main
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from prometheus_testlib import promtool_test, ttft_alert_test

OWNER = Owner(name="chat", namespace="team-a", uid="uid-1")
SPEC = InferenceServiceSpec.from_dict(
    {"model": "smollm2-135m", "autoscaling": {"maxReplicas": 3, "targetTTFTSeconds": 0.5}},
    name=OWNER.name,
    default_image="img",
)
ALERTS = {"PagodaTTFTHigh", "PagodaQueueBacklog", "PagodaKVCacheSaturated"}
THRESHOLD = "pagoda:ttft_alert_threshold_seconds"


def _values(runtime_monitor: bool, rule: bool) -> dict[str, Any]:
    monitoring = {
        **MONITORING_ON["monitoring"],
        "runtimeServiceMonitor": {"enabled": runtime_monitor},
        "prometheusRule": {"enabled": rule},
    }
    return {**MONITORING_ON, "monitoring": monitoring}


def _operator_children(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """What the chart's operator builds for OWNER, with the Prometheus Operator CRDs present."""
    parser = argparse.ArgumentParser()
    operator_main.add_arguments(parser)
    args = operator_container(docs)["args"]
    assert args[0] == "operator"
    config = operator_main.config_from_args(parser.parse_args(args[1:]))
    children = build_children(
        OWNER,
        SPEC,
        service_monitor=True,
        prometheus_rule=True,
        own_service_monitor=config.service_monitors,
        own_prometheus_rule=config.prometheus_rules,
        monitoring_labels=config.monitoring_labels,
    )
    return children.desired


def _selects(monitor: dict[str, Any], service: dict[str, Any]) -> bool:
    """Whether a ServiceMonitor selects a Service (and so scrapes the pods behind it)."""
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector") or {}
    ns = service["metadata"]["namespace"]
    if not namespaces.get("any"):
        allowed = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
        if ns not in allowed:
            return False
    wanted = spec["selector"].get("matchLabels", {})
    return wanted.items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize("runtime_monitor", [False, True], ids=["sm-operator", "sm-chart"])
@pytest.mark.parametrize("rule", [False, True], ids=["rules-operator", "rules-chart"])
def test_one_service_monitor_per_pod_and_each_alert_once(runtime_monitor: bool, rule: bool) -> None:
    docs = render(_values(runtime_monitor, rule))
    built = _operator_children(docs)
    service = next(c for c in built if c["kind"] == "Service")
    monitors = of_kind(docs, "ServiceMonitor") + of_kind(built, "ServiceMonitor")
    for m in monitors:
        m["metadata"].setdefault("namespace", NAMESPACE)
    scraping = [m["metadata"]["name"] for m in monitors if _selects(m, service)]
    assert len(scraping) == 1, f"the pods of {OWNER.name} are scraped by {scraping}"
    owner = "chart" if runtime_monitor else "operator"
    assert scraping[0] == ("pagoda-runtime" if runtime_monitor else OWNER.name), owner

    rules = of_kind(docs, "PrometheusRule") + of_kind(built, "PrometheusRule")
    names = collections.Counter(
        r.get("alert") or r["record"]
        for doc in rules
        for g in doc["spec"]["groups"]
        for r in g["rules"]
    )
    assert set(names) == {*ALERTS, THRESHOLD}
    assert max(names.values()) == 1, f"rules evaluated twice: {names}"
    owners = [r["metadata"]["name"] for r in rules]
    # the operator keeps the service's TTFT threshold (a recording rule) under either owner
    assert owners == (["pagoda-alerts", "chat-alerts"] if rule else ["chat-alerts"])

    # monitoring.labels reach whichever owns it (the operator through --monitoring-label), so a
    # kube-prometheus-stack Prometheus (selecting release: <its release>) picks every one up
    release = MONITORING_ON["monitoring"]["labels"]["release"]
    for doc in [*monitors, *rules, *of_kind(docs, "ConfigMap")]:
        assert doc["metadata"]["labels"]["release"] == release, doc["metadata"]["name"]


@pytest.mark.parametrize("rule", [False, True], ids=["rules-operator", "rules-chart"])
def test_ttft_alert_keeps_the_services_threshold_under_either_owner(
    rule: bool, tmp_path: pathlib.Path
) -> None:
    """promtool evaluates every PrometheusRule the chart and its operator make: a p95 TTFT of
    1.95 s alerts, once, for `chat` (targetTTFTSeconds 0.5: threshold 2 x 0.5 = 1 s) and not for
    `other` in the same namespace (no threshold of its own: the default 2 s)."""
    docs = render(_values(False, rule))
    built = _operator_children(docs)
    files = []
    for i, doc in enumerate(of_kind(docs, "PrometheusRule") + of_kind(built, "PrometheusRule")):
        files.append(f"rules-{i}.yaml")
        (tmp_path / files[-1]).write_text(yaml.safe_dump(doc["spec"]))
    ttft = alerts_by_name(monitoring_rules())["PagodaTTFTHigh"]
    annotations = {"summary": "team-a/chat: p95 time to first token is 1.95s",
                   "description": ttft["annotations"]["description"]}  # fmt: skip
    buckets = [("1.0", 0), ("2.0", 60), ("+Inf", 60)]
    test = ttft_alert_test(files, OWNER.namespace, OWNER.name, buckets, annotations)
    assert "SUCCESS" in promtool_test(tmp_path, test)
