"""Prometheus answers → numbers (operator/metrics_source.py); the queries themselves run against a
real Prometheus in test_autoscale_e2e.py."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from pagoda.operator.autoscaling.prometheus import (
    MetricsUnavailable,
    demand_queries,
    prompt_len_query,
    queries,
    query_url,
    scalar,
    url_allowed,
)
from pagoda.operator.autoscaling.rules import selector
from pagoda.operator.spec.config import OperatorConfig
from prometheus_testlib import promtool_test


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
        {"status": "success", "data": [{"value": [1, "1"]}]},  # a proxy's own shape
        vector("1", "2"),  # two series for an aggregate: a proxy's merge, not one answer
        [],
    ],
)
def test_scalar_rejects_error_answers(body: Any) -> None:
    with pytest.raises(MetricsUnavailable) as e:
        scalar(body)
    assert e.value.reason == "QueryFailed"


def test_error_answers_are_not_quoted() -> None:
    """A condition or Event never echoes a response body (the URL may be a spec's): Prometheus'
    errorType when it is a known one, counts, nothing else."""
    with pytest.raises(MetricsUnavailable) as e:
        scalar({"status": "error", "errorType": "timeout", "error": "secret text"})
    assert e.value.message == "error answer (timeout)"
    with pytest.raises(MetricsUnavailable) as e:
        scalar({"status": "error", "errorType": "<html>secret", "error": "secret"})
    assert e.value.message == "error answer"
    two = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"secret": "x"}, "value": [1, "1"]}, {"metric": {}, "value": [1, "2"]}]}}  # fmt: skip
    with pytest.raises(MetricsUnavailable) as e:
        scalar(two)
    assert e.value.message == "expected one series, got 2"


def test_the_query_path_is_joined_to_the_base_path() -> None:
    assert str(query_url("http://prom:9090")) == "http://prom:9090/api/v1/query"
    assert str(query_url("https://h/prometheus/")) == "https://h/prometheus/api/v1/query"
    # a query or fragment (refused in the spec and the settings) cannot swallow the path
    assert str(query_url("http://h/x?a=1#f")) == "http://h/x/api/v1/query"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://prom.monitoring:9090", True),
        ("http://PROM.monitoring:9090/", True),
        ("http://prom.monitoring:9091", False),  # another port
        ("https://prom.monitoring:9090", False),  # another scheme
        ("http://prom.monitoring:9090.evil.example", False),  # not a string prefix
        ("http://other.svc", False),
        ("https://thanos.example/team-a", True),
        ("https://thanos.example/team-a/sub", True),
        ("https://thanos.example/team-ab", False),  # a path prefix ends at a /
        ("https://thanos.example/team-a/../admin", False),  # compared normalised
        ("https://thanos.example:443/team-a", True),  # the default port
    ],
)
def test_allowed_prometheus_urls(url: str, allowed: bool) -> None:
    prefixes = ("http://prom.monitoring:9090", "https://thanos.example/team-a/")
    assert url_allowed(url, prefixes) is allowed


def test_the_default_allow_list_is_the_operators_prometheus() -> None:
    assert OperatorConfig().prometheus_url_prefixes is None  # nothing configured: any URL
    assert url_allowed("http://anything.svc", None)
    own = OperatorConfig(prometheus_url="http://user:pw@prom:9090")
    assert own.prometheus_url_prefixes == ("http://user:pw@prom:9090",)
    assert url_allowed("http://prom:9090/", own.prometheus_url_prefixes)
    assert not url_allowed("http://kubelet:10250", own.prometheus_url_prefixes)
    listed = OperatorConfig(
        prometheus_url="http://prom:9090", allowed_prometheus_urls=("http://thanos:9090",)
    )
    assert listed.prometheus_url_prefixes == ("http://thanos:9090",)
    for bad in ({"prometheus_url": "http://p/?x"}, {"allowed_prometheus_urls": ("http://p/#f",)}):
        with pytest.raises(ValueError, match="without a query"):
            OperatorConfig(**bad)


def test_allowed_prometheus_urls_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODA_ALLOWED_PROMETHEUS_URLS", "http://a:9090, https://b/x")
    assert OperatorConfig.from_env().allowed_prometheus_urls == ("http://a:9090", "https://b/x")


def test_queries_select_one_service() -> None:
    assert selector("ns", 'a"b') == '{namespace="ns",inferenceservice="a\\"b"}'
    q = queries("team-a", "chat", "30s")
    assert q["ttft_p95"] == (
        "histogram_quantile(0.95, sum by (le) (rate(pagoda:time_to_first_token_seconds_bucket"
        '{namespace="team-a",inferenceservice="chat"}[30s])))'
    )
    assert all('inferenceservice="chat"' in v for v in q.values())


def test_demand_queries_on_a_real_prometheus_engine(tmp_path: pathlib.Path) -> None:
    """promtool evaluates the demand floor's PromQL over scraped series (every 15 s): 2 requests/s
    finish while the in-flight count grows by 1/s, so 3 arrive per second; the output length is
    generated tokens over finished requests; another service's series change nothing."""
    q = demand_queries("ns", "chat")
    assert set(q) == {
        "arrival_rate", "arrival_rate_slow", "arrival_rate_fast", "output_len",
        "samples_per_request",
    }  # fmt: skip
    series = []
    for isvc, scale in (("chat", 1), ("other", 7)):
        labels = f'namespace="ns",inferenceservice="{isvc}",model_name="m"'
        for metric, values in (
            ('pagoda:request_success_total{finished_reason="stop",', f"0+{30 * scale}x40"),
            ("pagoda:num_requests_running{", f"5+{15 * scale}x40"),
            ("pagoda:num_requests_waiting{", "0+0x40"),
            ("pagoda:generation_tokens_total{", f"0+{30 * 64 * scale}x40"),
        ):
            series.append({"series": f"{metric}{labels}}}", "values": values})
    tests = [
        {"expr": q[key], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": want}]}
        for key, want in (
            ("arrival_rate", 3.0), ("arrival_rate_slow", 3.0), ("output_len", 64.0),
            ("samples_per_request", 1.0),  # no request_params_n series: one sample each
        )
    ]  # fmt: skip
    doc = {"tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}
    promtool_test(tmp_path, doc)


def test_arrivals_of_n_sample_requests_are_requests(tmp_path: pathlib.Path) -> None:
    """Requests of n=4: 1 request/s finishes (request_success counts requests) while the running
    gauge, which counts sequences, grows by 4/s: that is 1 more request in flight per second, so
    2 requests arrive per second (adding the gauge's 4/s as requests would say 5). The mean n
    comes from request_params_n (counted once per request, at its first output: 2/s)."""
    q = demand_queries("ns", "chat")
    labels = 'namespace="ns",inferenceservice="chat",model_name="m"'
    series = [
        {"series": f'pagoda:request_success_total{{finished_reason="stop",{labels}}}',
         "values": "0+15x40"},
        {"series": f"pagoda:num_requests_running{{{labels}}}", "values": "8+60x40"},
        {"series": f"pagoda:num_requests_waiting{{{labels}}}", "values": "0+0x40"},
        {"series": f"pagoda:request_params_n_sum{{{labels}}}", "values": "0+120x40"},
        {"series": f"pagoda:request_params_n_count{{{labels}}}", "values": "0+30x40"},
        {"series": f"pagoda:generation_tokens_total{{{labels}}}", "values": "0+3840x40"},
    ]  # fmt: skip
    tests = [
        {"expr": q[key], "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": want}]}
        for key, want in (
            ("arrival_rate", 2.0), ("arrival_rate_slow", 2.0), ("samples_per_request", 4.0),
            ("output_len", 256.0),  # per request: its 4 samples' 64 tokens each
        )
    ]  # fmt: skip
    doc = {"tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}
    promtool_test(tmp_path, doc)


def test_sample_age_is_measured_on_prometheus_clock(tmp_path: pathlib.Path) -> None:
    """The freshness input is an age computed by Prometheus (`time() - timestamp`), so the
    operator's clock never enters it: scraped every 15 s until 600 s, evaluated at 620 s."""
    q = queries("ns", "chat")
    labels = 'namespace="ns",inferenceservice="chat"'
    series = [{"series": f"pagoda:num_requests_waiting{{{labels}}}", "values": "1+0x40"}]
    tests = [
        {"expr": q["age"], "eval_time": "620s", "exp_samples": [{"labels": "{}", "value": 20}]}
    ]
    doc = {"tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}
    promtool_test(tmp_path, doc)


def test_fast_arrival_rate_and_prompt_length_on_a_5s_scrape(tmp_path: pathlib.Path) -> None:
    """On the 5 s scrape the chart and the operator's ServiceMonitor use, promtool evaluates the
    15 s arrival rate (the burst floor's input) 10 s after the load tripled: it shows all of it. The mean prompt length
    divides prompt tokens by first tokens (the TTFT histogram's count), both counted at the first
    token, so a burst whose requests have not finished yet does not inflate it."""
    q = {**demand_queries("ns", "chat"), "prompt_len": prompt_len_query("ns", "chat")}
    labels = 'namespace="ns",inferenceservice="chat",model_name="m"'
    # 61 samples at 5 s: 1 request/s finishes (5 per sample) until 285 s, then 3/s; in flight
    # stays at 4. First tokens lead the finishes: 2/s of 1,000-token prompts.
    done = "0+5x57 300+15x2"
    series = [
        {
            "series": f'pagoda:request_success_total{{finished_reason="stop",{labels}}}',
            "values": done,
        },
        {"series": f"pagoda:num_requests_running{{{labels}}}", "values": "4+0x60"},
        {"series": f"pagoda:num_requests_waiting{{{labels}}}", "values": "0+0x60"},
        {"series": f"pagoda:generation_tokens_total{{{labels}}}", "values": "0+160x60"},
        {"series": f"pagoda:time_to_first_token_seconds_count{{{labels}}}", "values": "0+10x60"},
        {"series": f"pagoda:prompt_tokens_total{{{labels}}}", "values": "0+10000x60"},
    ]
    tests = [
        {"expr": q[key], "eval_time": "300s", "exp_samples": [{"labels": "{}", "value": want}]}
        for key, want in (("arrival_rate_fast", 3.0), ("prompt_len", 1000.0))
    ]
    doc = {"tests": [{"interval": "5s", "input_series": series, "promql_expr_test": tests}]}
    promtool_test(tmp_path, doc)


async def test_credentials_in_the_prometheus_url_stay_out_of_messages() -> None:
    """A Prometheus behind basic auth is reached as http://user:password@host; its failures go
    into conditions, Events and logs without the password (they once quoted the whole URL)."""
    from e2e_processes import free_port
    from fake_prometheus import FakePrometheus
    from pagoda.operator.autoscaling.prometheus import PrometheusSource

    prom = FakePrometheus()
    await prom.start()
    source = PrometheusSource(timeout_s=2.0)
    try:
        prom.status = 503
        closed = f"http://user:s3cret@127.0.0.1:{free_port()}"  # nothing listens there
        for url, reason in ((f"http://user:s3cret@127.0.0.1:{prom.port}", "QueryFailed"),
                            (closed, "PrometheusUnreachable")):  # fmt: skip
            with pytest.raises(MetricsUnavailable) as e:
                await source.fetch(url, "ns", "chat")
            assert e.value.reason == reason
            assert "s3cret" not in str(e.value) and "127.0.0.1" in e.value.message
    finally:
        await source.close()
        await prom.stop()


async def test_a_slow_prometheus_is_named_as_such() -> None:
    """A query past --prometheus-timeout holds with a message that says so (it read
    "TimeoutError()")."""
    from fake_prometheus import FakePrometheus
    from pagoda.operator.autoscaling.prometheus import PrometheusSource

    prom = FakePrometheus()
    prom.delay = 2.0
    await prom.start()
    source = PrometheusSource(timeout_s=0.3)
    try:
        with pytest.raises(MetricsUnavailable) as e:
            await source.fetch(prom.url, "ns", "chat")
        assert e.value.reason == "PrometheusUnreachable"
        assert e.value.message.endswith("no answer within 0.3 s"), e.value.message
    finally:
        await source.close()
        await prom.stop()
