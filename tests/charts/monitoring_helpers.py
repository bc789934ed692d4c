"""Shared by the chart's monitoring tests: the rule and dashboard files, the series the runtime
exports, and small readers of rules, relabelings and dashboard targets."""

from __future__ import annotations

import re
from typing import Any

import yaml
from chart_helpers import CHART

FILES = CHART / "files"
RULES_FILE = FILES / "prometheus-rules.yaml"
DASHBOARD_FILE = FILES / "grafana-dashboard.json"
# The runtime's metrics (runtime/server/metrics.py); histograms expose _bucket/_sum/_count.
HISTOGRAMS = {
    "pagoda:time_to_first_token_seconds",
    "pagoda:inter_token_latency_seconds",
    "pagoda:e2e_request_latency_seconds",
    "pagoda:request_queue_time_seconds",
    "pagoda:request_params_n",
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
    # speculative decoding (`--speculative-config`, spec.engine.speculative) only
    "pagoda:spec_decode_num_drafts_total",
    "pagoda:spec_decode_num_draft_tokens_total",
    "pagoda:spec_decode_num_accepted_tokens_total",
    "pagoda:spec_decode_num_accepted_tokens_per_pos_total",
    # a vision model's encoder cache only
    "pagoda:mm_encoder_cache_queries_total",
    "pagoda:mm_encoder_cache_hits_total",
}
SERIES = GAUGES | COUNTERS | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
METRIC = re.compile(r"pagoda:[a-z0-9_]+")
# series a recording rule makes (the operator's per-service TTFT alert threshold), not the runtime
RECORDED = {"pagoda:ttft_alert_threshold_seconds"}


def rules() -> dict[str, Any]:
    return yaml.safe_load(RULES_FILE.read_text())


def alerts_by_name(groups: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups["groups"] for r in g["rules"]}


def relabel_targets(relabelings: list[dict[str, Any]], key: str, target: str) -> dict[str, str]:
    return {r[target]: r[key][0] for r in relabelings if r.get(target)}


def dashboard_targets(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dashboard["panels"] for t in p.get("targets", [])]
