"""Monitoring pieces of the chart: alert rules (checked and unit-tested with promtool), the
runtime/operator ServiceMonitors, the Alertmanager route to the operator's webhook, the
Grafana dashboard, and their agreement with the runtime's metric names."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import subprocess
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    of_kind,
    one,
    operator_container,
    render,
    render_cached,
    require_tool,
)
from pagoda.operator import builders, names

FILES = CHART / "files"
RULES_FILE = FILES / "prometheus-rules.yaml"
DASHBOARD_FILE = FILES / "grafana-dashboard.json"
# The runtime's metrics (runtime/server/metrics.py); histograms expose _bucket/_sum/_count.
HISTOGRAMS = {
    "pagoda:time_to_first_token_seconds",
    "pagoda:inter_token_latency_seconds",
    "pagoda:e2e_request_latency_seconds",
    "pagoda:request_queue_time_seconds",
}
GAUGES = {
    "pagoda:num_requests_running",
    "pagoda:num_requests_waiting",
    "pagoda:kv_cache_usage_perc",
}
COUNTERS = {
    "pagoda:prefix_cache_queries_total",
    "pagoda:prefix_cache_hits_total",
    "pagoda:num_preemptions_total",
    "pagoda:prompt_tokens_total",
    "pagoda:generation_tokens_total",
    "pagoda:request_success_total",
}
SERIES = GAUGES | COUNTERS | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
METRIC = re.compile(r"pagoda:[a-z0-9_]+")


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text())


def alerts_by_name(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups["groups"] for r in g["rules"]}


def promtool(*args: str, cwd: pathlib.Path) -> str:
    result = subprocess.run(
        [require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# --- alert rules ---------------------------------------------------------------------------


def test_rules_file_defines_the_alerts_the_autoscaler_relies_on() -> None:
    alerts = alerts_by_name(rules())
    assert set(alerts) == {"PagodaTTFTHigh", "PagodaQueueBacklog", "PagodaKVCacheSaturated"}
    ttft = " ".join(alerts["PagodaTTFTHigh"]["expr"].split())
    assert ttft.startswith(
        "histogram_quantile(0.95, sum by (namespace, inferenceservice, le) "
        "(rate(pagoda:time_to_first_token_seconds_bucket[1m]))) > "
    )
    assert "pagoda:num_requests_waiting" in alerts["PagodaQueueBacklog"]["expr"]
    assert (
        "max by (namespace, inferenceservice) (pagoda:kv_cache_usage_perc)"
        in (alerts["PagodaKVCacheSaturated"]["expr"])
    )
    for name, alert in alerts.items():
        assert "by (namespace, inferenceservice" in alert["expr"], name
        assert re.search(r">\s*[0-9.]+\s*$", alert["expr"]), f"{name}: must end with '> NUMBER'"
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert {"summary", "description"} <= set(alert["annotations"])
    assert alerts["PagodaTTFTHigh"]["labels"]["pagoda_action"] == "scale_up"
    assert alerts["PagodaQueueBacklog"]["labels"]["pagoda_action"] == "scale_up"
    assert "pagoda_action" not in alerts["PagodaKVCacheSaturated"]["labels"]


def test_rendered_prometheus_rule_is_the_file_with_thresholds_from_values() -> None:
    rule = one(render_cached("monitoring"), "PrometheusRule")
    assert rule["spec"] == rules(), "defaults in values.yaml must equal the file's"
    custom = render(
        {
            "monitoring": {
                "prometheusRule": {
                    "enabled": True,
                    "alerts": {
                        "ttftHigh": {"threshold": 0.75, "for": "30s"},
                        "queueBacklog": {"threshold": 4, "for": "0s"},
                        "kvCacheSaturated": {"threshold": 0.9, "for": "10m"},
                    },
                }
            }
        }
    )
    rendered = alerts_by_name(one(custom, "PrometheusRule")["spec"])
    expected = alerts_by_name(rules())
    for name, threshold, for_ in (
        ("PagodaTTFTHigh", "0.75", "30s"),
        ("PagodaQueueBacklog", "4", "0s"),
        ("PagodaKVCacheSaturated", "0.9", "10m"),
    ):
        assert rendered[name]["expr"].endswith(f"> {threshold}")
        assert rendered[name]["for"] == for_
        base = re.sub(r">\s*[0-9.]+\s*$", "", expected[name]["expr"])
        assert rendered[name]["expr"].startswith(base)
        assert {k: v for k, v in rendered[name].items() if k not in ("expr", "for")} == {
            k: v for k, v in expected[name].items() if k not in ("expr", "for")
        }


def test_promtool_checks_the_file_and_the_rendered_rules(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file.yaml").write_text(RULES_FILE.read_text())
    spec = one(render_cached("monitoring"), "PrometheusRule")["spec"]
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump(spec))
    out = promtool("check", "rules", "file.yaml", "rendered.yaml", cwd=tmp_path)
    assert out.count("SUCCESS: 3 rules found") == 2


PROMTOOL_TEST = """
rule_files: [rules.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      # slow: every first token in (1, 2.5] s, on two pods -> p95 = 1 + 1.5 * 0.95 = 2.425 s
      {slow_buckets}
      # fast: every first token under 0.5 s
      {fast_buckets}
      - series: 'pagoda:num_requests_waiting{{namespace="team-a", inferenceservice="slow", pod="p1", model_name="m"}}'
        values: '10x40'
      - series: 'pagoda:num_requests_waiting{{namespace="team-a", inferenceservice="slow", pod="p2", model_name="m"}}'
        values: '10x40'
      - series: 'pagoda:num_requests_waiting{{namespace="team-b", inferenceservice="fast", pod="p3", model_name="m"}}'
        values: '5x40'
      - series: 'pagoda:kv_cache_usage_perc{{namespace="team-a", inferenceservice="slow", pod="p1", model_name="m"}}'
        values: '0.97x60'
      - series: 'pagoda:kv_cache_usage_perc{{namespace="team-a", inferenceservice="slow", pod="p2", model_name="m"}}'
        values: '0.2x60'
      - series: 'pagoda:kv_cache_usage_perc{{namespace="team-b", inferenceservice="fast", pod="p3", model_name="m"}}'
        values: '0.5x60'
    alert_rule_test:
      - eval_time: 30s
        alertname: PagodaTTFTHigh
        exp_alerts: []
      - eval_time: 5m
        alertname: PagodaTTFTHigh
        exp_alerts:
          - exp_labels: {{severity: warning, pagoda_action: scale_up, namespace: team-a, inferenceservice: slow}}
            exp_annotations:
              summary: "team-a/slow: p95 time to first token is 2.425s"
              description: {ttft_description}
      - eval_time: 5m
        alertname: PagodaQueueBacklog
        exp_alerts:
          - exp_labels: {{severity: warning, pagoda_action: scale_up, namespace: team-a, inferenceservice: slow}}
            exp_annotations:
              summary: "team-a/slow: 20 requests waiting"
              description: {queue_description}
      - eval_time: 3m
        alertname: PagodaKVCacheSaturated
        exp_alerts: []
      - eval_time: 10m
        alertname: PagodaKVCacheSaturated
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: team-a, inferenceservice: slow}}
            exp_annotations:
              summary: "team-a/slow: KV cache 97% full"
              description: {kv_description}
"""


def _buckets(namespace: str, isvc: str, pod: str, per_bucket: dict[str, int]) -> str:
    lines = []
    for le, step in per_bucket.items():
        series = (
            f'pagoda:time_to_first_token_seconds_bucket{{namespace="{namespace}", '
            f'inferenceservice="{isvc}", pod="{pod}", model_name="m", le="{le}"}}'
        )
        lines.append(f"- series: '{series}'\n        values: '0+{step}x40'")
    return "\n      ".join(lines)


def test_promtool_unit_tests_the_alerts(tmp_path: pathlib.Path) -> None:
    """Alerts fire for the InferenceService that breaches, per namespace + inferenceservice
    (pods summed), with the labels the operator's webhook reads, and not for the others."""
    alerts = alerts_by_name(rules())
    slow = {"0.5": 0, "1": 0, "2.5": 10, "5": 10, "+Inf": 10}
    fast = {"0.5": 10, "1": 10, "2.5": 10, "5": 10, "+Inf": 10}
    (tmp_path / "rules.yaml").write_text(RULES_FILE.read_text())
    (tmp_path / "test.yaml").write_text(
        PROMTOOL_TEST.format(
            slow_buckets="\n      ".join(
                [_buckets("team-a", "slow", "p1", slow), _buckets("team-a", "slow", "p2", slow)]
            ),
            fast_buckets=_buckets("team-b", "fast", "p3", fast),
            ttft_description=json.dumps(alerts["PagodaTTFTHigh"]["annotations"]["description"]),
            queue_description=json.dumps(
                alerts["PagodaQueueBacklog"]["annotations"]["description"]
            ),
            kv_description=json.dumps(
                alerts["PagodaKVCacheSaturated"]["annotations"]["description"]
            ),
        )
    )
    out = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert "SUCCESS" in out


# --- scraping --------------------------------------------------------------------------------


def _relabel_targets(relabelings: list[dict[str, Any]], key: str, target: str) -> dict[str, str]:
    return {r[target]: r[key][0] for r in relabelings if r.get(target)}


def test_runtime_service_monitor_selects_operator_built_services_and_adds_keys() -> None:
    docs = render_cached("monitoring")
    monitor = one(docs, "ServiceMonitor", f"{RELEASE}-runtime")
    selector = monitor["spec"]["selector"]["matchLabels"]
    service = builders.build_service(builders.Owner(name="llama", namespace="team-a", uid="u"))
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    targets = _relabel_targets(endpoint["relabelings"], "sourceLabels", "targetLabel")
    assert targets["namespace"] == "__meta_kubernetes_namespace"
    instance = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", names.LABEL_INSTANCE)
    assert targets["inferenceservice"] == instance
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    namespaced = one(render_cached("namespaced-monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}


def test_operator_service_monitor_scrapes_the_operator_service() -> None:
    docs = render_cached("monitoring")
    monitor = one(docs, "ServiceMonitor", f"{RELEASE}-operator")
    service = one(docs, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    for doc in of_kind(docs, "ServiceMonitor") + of_kind(docs, "PrometheusRule"):
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_plain_prometheus_scrape_example(tmp_path: pathlib.Path) -> None:
    """Same relabeling as the ServiceMonitor; promtool accepts the config. (Debian's promtool is
    built without Kubernetes service discovery, so it is checked with static targets there.)"""
    example = yaml.safe_load((FILES / "prometheus-scrape-example.yaml").read_text())
    (job,) = example["scrape_configs"]
    targets = _relabel_targets(job["relabel_configs"], "source_labels", "target_label")
    monitor = one(render_cached("monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert targets == _relabel_targets(endpoint["relabelings"], "sourceLabels", "targetLabel")
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
    service = one(docs, "Service")
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
    service = one(default, "Service")
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


# --- Grafana ----------------------------------------------------------------------------------


def _targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dashboard["panels"] for t in p.get("targets", [])]


def test_grafana_dashboard_config_map() -> None:
    docs = render_cached("monitoring")
    config_map = one(docs, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    (text,) = config_map["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD_FILE.read_text())
    other = render(
        {
            "monitoring": {
                "grafanaDashboard": {
                    "enabled": True,
                    "label": "dash",
                    "labelValue": "yes",
                    "namespace": "grafana",
                }
            }
        }
    )
    config_map = one(other, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["dash"] == "yes"


def test_grafana_dashboard_panels_and_queries() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    for title in (
        "Time to first token",
        "Inter-token latency",
        "Queue depth",
        "KV cache usage",
        "Prefix-cache hit rate",
        "Replicas",
    ):
        assert title in titles
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "inferenceservice"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for target in _targets(dashboard):
        expr = target["expr"]
        assert set(METRIC.findall(expr)) <= SERIES, expr
        for selector in re.findall(r"pagoda:[a-z0-9_]+(\{[^}]*\})?", expr):
            assert (
                'namespace=~"$namespace"' in selector
                and 'inferenceservice=~"$inferenceservice"' in selector
            ), expr


def test_promtool_parses_every_dashboard_query(tmp_path: pathlib.Path) -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    records = []
    for i, target in enumerate(_targets(dashboard)):
        expr = target["expr"].replace("$__rate_interval", "1m")
        expr = expr.replace("$namespace", ".*").replace("$inferenceservice", ".*")
        records.append({"record": f"pagoda_dashboard:query_{i}", "expr": expr})
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]})
    )
    out = promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(records)} rules found" in out


# --- agreement with the runtime ---------------------------------------------------------------


def test_metric_names_exist_in_the_runtime() -> None:
    """Every series the alerts and the dashboard use is one the runtime exports."""
    try:
        from pagoda.runtime.server.metrics import ServerMetrics
        from prometheus_client import generate_latest
    except ImportError as e:  # the server is being written in parallel
        pytest.skip(f"runtime metrics not importable: {e}")
    exported = set()
    for line in generate_latest(ServerMetrics("m").registry).decode().splitlines():
        if line and not line.startswith("#"):
            exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    exprs = [a["expr"] for a in alerts_by_name(rules()).values()]
    exprs += [t["expr"] for t in _targets(json.loads(DASHBOARD_FILE.read_text()))]
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= SERIES
    assert used <= exported, f"not exported by the runtime: {sorted(used - exported)}"
    assert {m for m in exported if m.startswith("pagoda:")} <= SERIES | {
        m for m in exported if m.endswith("_created")
    }


def test_value_sets_render_monitoring_only_when_enabled() -> None:
    kinds = {d["kind"] for d in render_cached("defaults")}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "AlertmanagerConfig", "ConfigMap"}
    assert VALUE_SETS["monitoring"]["monitoring"]["prometheusRule"]["enabled"] is True


def test_operator_built_service_monitor_adds_the_same_labels() -> None:
    chart = one(render_cached("monitoring"), "ServiceMonitor", f"{RELEASE}-runtime")
    (chart_endpoint,) = chart["spec"]["endpoints"]
    built = builders.build_service_monitor(
        builders.Owner(name="llama", namespace="team-a", uid="u")
    )
    (endpoint,) = built["spec"]["endpoints"]
    expected = _relabel_targets(chart_endpoint["relabelings"], "sourceLabels", "targetLabel")
    got = _relabel_targets(endpoint.get("relabelings", []), "sourceLabels", "targetLabel")
    assert {k: got.get(k) for k in ("namespace", "inferenceservice")} == {
        k: expected[k] for k in ("namespace", "inferenceservice")
    }
