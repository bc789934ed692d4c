"""The chart's Grafana dashboard (ConfigMap, panels, queries promtool can parse) and the agreement
of every series the alerts and the dashboard use with what the runtime exports."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml
from chart_helpers import (
    one,
    render,
    render_cached,
)
from monitoring_helpers import (
    DASHBOARD_FILE,
    METRIC,
    RECORDED,
    SERIES,
    alerts_by_name,
    dashboard_targets,
    rules,
)
from prometheus_testlib import promtool

# --- Grafana ----------------------------------------------------------------------------------


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
        "Draft acceptance rate",
        "Accepted tokens per draft",
    ):
        assert title in titles
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "inferenceservice"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for target in dashboard_targets(dashboard):
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
    for i, target in enumerate(dashboard_targets(dashboard)):
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
        from pagoda.runtime.engine.outputs import EngineStats
        from pagoda.runtime.server.metrics import ServerMetrics
        from prometheus_client import generate_latest
    except ImportError as e:  # the server is being written in parallel
        pytest.skip(f"runtime metrics not importable: {e}")
    metrics = ServerMetrics("m")  # a server with --speculative-config: its counters too
    metrics.last_stats = EngineStats(1, 0, 0.5, 8, 4, 10, 5, 0, 3, 12, 7, [4, 2, 1, 0])
    exported = set()
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    exprs = [a["expr"] for a in alerts_by_name(rules()).values()]
    exprs += [t["expr"] for t in dashboard_targets(json.loads(DASHBOARD_FILE.read_text()))]
    used = {m for e in exprs for m in METRIC.findall(e)} - RECORDED
    assert used <= SERIES
    assert used <= exported, f"not exported by the runtime: {sorted(used - exported)}"
    assert {m for m in exported if m.startswith("pagoda:")} <= SERIES | {
        m for m in exported if m.endswith("_created")
    }
