"""Prometheus answers → numbers (operator/metrics_source.py); the queries themselves run against a
real Prometheus in test_autoscale_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest
from pagoda.operator.autoscaling.prometheus import MetricsUnavailable, queries, scalar
from pagoda.operator.autoscaling.rules import selector


def vector(*values: str) -> dict[str, Any]:
    result = [{"metric": {}, "value": [1700000000.0, v]} for v in values]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (vector("0.25"), 0.25),
        (vector("NaN"), None),
        (vector(), None),
        (vector("+Inf"), float("inf")),
    ],
)
def test_scalar(body: dict[str, Any], want: float | None) -> None:
    assert scalar(body) == want


@pytest.mark.parametrize(
    "body",
    [
        {"status": "error", "errorType": "bad_data", "error": "parse error"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
        {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "x"]}]}},
        [],
    ],
)
def test_scalar_rejects_error_answers(body: Any) -> None:
    with pytest.raises(MetricsUnavailable) as e:
        scalar(body)
    assert e.value.reason == "QueryFailed"


def test_queries_select_one_service() -> None:
    assert selector("ns", 'a"b') == '{namespace="ns",inferenceservice="a\\"b"}'
    q = queries("team-a", "chat", "30s")
    assert q["ttft_p95"] == (
        "histogram_quantile(0.95, sum by (le) (rate(pagoda:time_to_first_token_seconds_bucket"
        '{namespace="team-a",inferenceservice="chat"}[30s])))'
    )
    assert all('inferenceservice="chat"' in v for v in q.values())
