"""Pagoda's alert rules for one InferenceService, as a PrometheusRule the operator owns.

The rules come from `prometheus-rules.yaml` (package data: the chart's `files/prometheus-rules.yaml`
as JSON, which is YAML too, so the operator needs no YAML parser;
tests/operator/test_rules.py keeps the two equal and prints the command that regenerates it).

The service's TTFT alert threshold is `ALERT_TTFT_FACTOR` × targetTTFTSeconds: the evaluation
loop acts at the target, the alert is the "clearly overloaded" signal that Alertmanager sends to
POST /alerts for an immediate step. It lives in a recording rule, `THRESHOLD_METRIC` with the
service's `namespace`/`inferenceservice` labels, which the file's PagodaTTFTHigh compares with
(falling back to its own number for services without one). So the threshold holds whoever
evaluates the alerts: the operator's per-service copy of the file (every `pagoda:` selector
narrowed to the service, thresholds and `for` the file's, TTFT's default set to the same
threshold), or, with `--no-prometheus-rules`, the chart's single PrometheusRule, next to which the
operator keeps only the recording rule. Pure functions, no I/O beyond reading the packaged file
once.
"""

from __future__ import annotations

import copy
import functools
import json
import pathlib
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

RULES_FILE = pathlib.Path(__file__).with_name("prometheus-rules.yaml")
ALERT_TTFT_FACTOR = 2.0
THRESHOLD_METRIC = "pagoda:ttft_alert_threshold_seconds"
THRESHOLD_GROUP = "pagoda.thresholds"
_METRIC = re.compile(r"(pagoda:[A-Za-z0-9_]+)(\{[^}]*\})?")
# The file's convention (the chart's template relies on it too): each expr ends with `> NUMBER`.
_THRESHOLD = re.compile(r">\s*[-+]?[0-9][0-9.eE+-]*\s*$")


def label_value(value: str) -> str:
    """A string as a quoted PromQL label value needs it (backslash, quote, newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(namespace: str, name: str) -> str:
    """The label matchers of one InferenceService's series (the ServiceMonitor adds the labels)."""
    return f'{{namespace="{label_value(namespace)}",inferenceservice="{label_value(name)}"}}'


@functools.cache
def _load() -> dict[str, Any]:
    return json.loads(RULES_FILE.read_text(encoding="utf-8"))


def rules_document() -> dict[str, Any]:
    """The packaged rule file as data (a fresh copy)."""
    return copy.deepcopy(_load())


def scope_expr(expr: str, namespace: str, name: str) -> str:
    """Add the service's label matchers to every `pagoda:` selector in `expr`."""
    matchers = selector(namespace, name)[1:-1]

    def add(m: re.Match[str]) -> str:
        inner = (m.group(2) or "{}")[1:-1].strip()
        return f"{m.group(1)}{{{inner + ',' if inner else ''}{matchers}}}"

    return _METRIC.sub(add, expr)


def set_threshold(expr: str, threshold: float) -> str:
    if not _THRESHOLD.search(expr):
        raise ValueError(f"expr does not end with '> NUMBER': {expr!r}")
    return _THRESHOLD.sub(f"> {threshold:g}", expr)


def alert_ttft_threshold(spec: InferenceServiceSpec) -> float | None:
    """The service's own PagodaTTFTHigh threshold, s (None: the rule file's default)."""
    target = spec.autoscaling.target_ttft_seconds if spec.autoscaling else None
    return None if target is None else ALERT_TTFT_FACTOR * target


def threshold_rule(namespace: str, name: str, threshold: float) -> dict[str, Any]:
    """The recording rule of one service's TTFT alert threshold (a constant series)."""
    return {
        "record": THRESHOLD_METRIC,
        "expr": f"vector({threshold:g})",
        "labels": {"namespace": namespace, "inferenceservice": name},
    }


def service_rules(
    namespace: str,
    name: str,
    spec: InferenceServiceSpec,
    *,
    alerts: bool = True,
    for_: str | None = None,
) -> dict[str, Any] | None:
    """`{"groups": [...]}` for one service: its threshold's recording rule (with
    targetTTFTSeconds) and, with `alerts`, the file's alerts scoped to it; None when that leaves
    nothing. `for_` overrides every alert's `for`, for tests."""
    threshold = alert_ttft_threshold(spec)
    groups: list[dict[str, Any]] = []
    if threshold is not None:
        groups.append(
            {"name": THRESHOLD_GROUP, "rules": [threshold_rule(namespace, name, threshold)]}
        )
    if alerts:
        for group in rules_document()["groups"]:
            for rule in group["rules"]:
                rule["expr"] = scope_expr(" ".join(rule["expr"].split()), namespace, name)
                if rule.get("alert") == "PagodaTTFTHigh" and threshold is not None:
                    rule["expr"] = set_threshold(rule["expr"], threshold)
                if for_ is not None:
                    rule["for"] = for_
            groups.append(group)
    return {"groups": groups} if groups else None


def rule_name(name: str) -> str:
    return f"{name}-alerts"
