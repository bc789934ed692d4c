"""The operator's copy of the alert rules and the per-service PrometheusRule it renders
(operator/rules.py), checked with promtool (`check rules`, and a unit test of the scoped alert)."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from operator_harness import ROOT
from pagoda.operator.autoscaling import rules
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.spec.inference_service import InferenceServiceSpec
from prometheus_testlib import promtool, promtool_test, ttft_alert_test

CHART_RULES = ROOT / "charts" / "pagoda" / "files" / "prometheus-rules.yaml"
REGENERATE = (
    '.venv/bin/python -c "import json, yaml; print(json.dumps(yaml.safe_load(open('
    "'charts/pagoda/files/prometheus-rules.yaml')), indent=2, ensure_ascii=False))\" "
    "> operator/autoscaling/prometheus-rules.yaml"
)


def spec(**auto: object) -> InferenceServiceSpec:
    autoscaling = {"maxReplicas": 3, "targetTTFTSeconds": 0.25, **auto}
    return InferenceServiceSpec.from_dict(
        {"model": "smollm2-135m", "autoscaling": autoscaling}, name="chat", default_image="img"
    )


def test_packaged_rules_equal_the_charts() -> None:
    """The chart's file is the source of truth; the operator ships it as JSON (also YAML)."""
    packaged = json.loads(rules.RULES_FILE.read_text())
    assert packaged == yaml.safe_load(CHART_RULES.read_text()), f"regenerate: {REGENERATE}"
    assert yaml.safe_load(rules.RULES_FILE.read_text()) == packaged


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (
            "sum(pagoda:num_requests_waiting) > 16",
            'sum(pagoda:num_requests_waiting{namespace="ns",inferenceservice="chat"}) > 16',
        ),
        (
            'rate(pagoda:x_bucket{le="1"}[1m]) / pagoda:y',
            'rate(pagoda:x_bucket{le="1",namespace="ns",inferenceservice="chat"}[1m]) / '
            'pagoda:y{namespace="ns",inferenceservice="chat"}',
        ),
        ("up > 0", "up > 0"),
    ],
)
def test_scope_expr(expr: str, want: str) -> None:
    assert rules.scope_expr(expr, "ns", "chat") == want


def test_thresholds() -> None:
    assert rules.set_threshold("x > 2", 0.5) == "x > 0.5"
    with pytest.raises(ValueError):
        rules.set_threshold("x < 2", 0.5)
    doc = rules.service_rules("ns", "chat", spec())
    assert doc["groups"][0] == {
        "name": "pagoda.thresholds",
        "rules": [
            {
                "record": "pagoda:ttft_alert_threshold_seconds",
                "expr": "vector(0.5)",
                "labels": {"namespace": "ns", "inferenceservice": "chat"},
            }
        ],
    }
    exprs = {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert set(exprs) == {"PagodaTTFTHigh", "PagodaQueueBacklog", "PagodaKVCacheSaturated"}
    assert exprs["PagodaTTFTHigh"].endswith("> 0.5")  # 2 x targetTTFTSeconds
    assert exprs["PagodaQueueBacklog"].endswith("> 16")  # the chart's default
    no_ttft = rules.service_rules("ns", "chat", spec(targetTTFTSeconds=None, targetQueueDepth=2))
    assert no_ttft["groups"][0]["rules"][0]["expr"].endswith("> 2")  # the file's own threshold


def test_builder_adds_the_rule_only_with_autoscaling() -> None:
    owner = Owner("chat", "ns", "uid-1")
    kinds = [c["kind"] for c in build_children(owner, spec(), prometheus_rule=True).desired]
    assert "PrometheusRule" in kinds
    plain = InferenceServiceSpec.from_dict(
        {"model": "smollm2-135m"}, name="chat", default_image="i"
    )
    children = build_children(owner, plain, prometheus_rule=True)
    assert ("PrometheusRule", "chat-alerts") in children.absent
    off = build_children(owner, spec(), prometheus_rule=False)
    assert "PrometheusRule" not in [c["kind"] for c in off.desired]
    assert ("PrometheusRule", "chat-alerts") not in off.absent
    # --no-prometheus-rules: the chart's PrometheusRule owns the alerts; the operator's goes
    queue_only = spec(targetTTFTSeconds=None, targetQueueDepth=2)
    mine_off = build_children(owner, queue_only, prometheus_rule=True, own_prometheus_rule=False)
    assert "PrometheusRule" not in [c["kind"] for c in mine_off.desired]
    assert ("PrometheusRule", "chat-alerts") in mine_off.absent
    # ... except with targetTTFTSeconds: the threshold the chart's alert compares with stays
    mine_off = build_children(owner, spec(), prometheus_rule=True, own_prometheus_rule=False)
    (kept,) = [c for c in mine_off.desired if c["kind"] == "PrometheusRule"]
    assert [g["name"] for g in kept["spec"]["groups"]] == ["pagoda.thresholds"]


def test_rendered_rules_pass_promtool_and_fire_only_for_their_service(
    tmp_path: pathlib.Path,
) -> None:
    doc = rules.service_rules("ns", "chat", spec(), for_="0s")
    ttft_rule = doc["groups"][1]["rules"][0]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(doc))
    promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    # p95 TTFT of ~0.75 s (over 2 x 0.25 s) on both services; only ours may alert
    annotations = {"summary": "ns/chat: p95 time to first token is 975ms",
                   "description": ttft_rule["annotations"]["description"]}  # fmt: skip
    buckets = [("0.5", 0), ("1.0", 60), ("+Inf", 60)]
    promtool_test(tmp_path, ttft_alert_test(["rules.yaml"], "ns", "chat", buckets, annotations))
