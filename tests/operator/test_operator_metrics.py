"""The operator's own /metrics (operator/web/metrics.py)."""

from __future__ import annotations

import prometheus_client
from pagoda.operator.web.metrics import OperatorMetrics
from prometheus_client.parser import text_string_to_metric_families


def test_no_created_series_beside_the_counters_and_histograms() -> None:
    """prometheus_client adds a `*_created` gauge per counter and histogram child unless told
    not to: noise (a series per label set), and the runtime's /metrics has none either."""
    prometheus_client.enable_created_metrics()  # the library's default, whatever ran before
    m = OperatorMetrics()
    m.scale_events.labels("ns", "chat", "up", "policy").inc()
    m.reconcile_duration.labels("create").observe(0.2)
    m.autoscale_duration.observe(0.1)
    m.alerts.labels("accepted").inc()
    text = m.render().decode()
    assert "_created" not in text, text
    samples = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "pagoda_operator_scale_events_total" in samples
    assert "pagoda_operator_reconcile_duration_seconds_count" in samples
