"""The chart's alert rules: the alerts the autoscaler relies on, the rendered PrometheusRule
with thresholds from values, and promtool's checks and unit tests of the file."""

from __future__ import annotations

import json
import pathlib
import re

import yaml
from chart_helpers import (
    one,
    render,
    render_cached,
)
from monitoring_helpers import (
    RULES_FILE,
    alerts_by_name,
    rules,
)
from prometheus_testlib import promtool

# --- alert rules ---------------------------------------------------------------------------


def test_rules_file_defines_the_alerts_the_autoscaler_relies_on() -> None:
    alerts = alerts_by_name(rules())
    assert set(alerts) == {"PagodaTTFTHigh", "PagodaQueueBacklog", "PagodaKVCacheSaturated"}
    ttft = " ".join(alerts["PagodaTTFTHigh"]["expr"].split())
    quantile = (
        "histogram_quantile(0.95, sum by (namespace, inferenceservice, le) "
        "(rate(pagoda:time_to_first_token_seconds_bucket[1m])))"
    )
    # a service's own threshold series (the operator's recording rule), else the file's number
    assert ttft == (
        f"({quantile} > on (namespace, inferenceservice) max by (namespace, inferenceservice) "
        f"(pagoda:ttft_alert_threshold_seconds)) or ({quantile} unless on (namespace, "
        "inferenceservice) pagoda:ttft_alert_threshold_seconds) > 2"
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
              summary: "team-a/slow: 20 sequences waiting"
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
