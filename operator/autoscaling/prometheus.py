"""Reads one InferenceService's metrics from Prometheus' HTTP API (`/api/v1/query`).

Every series carries `namespace` and `inferenceservice` labels (the ServiceMonitor's relabeling),
so a few instant queries give the autoscaler all it needs. They are evaluated at Prometheus' own
"now", and the samples' age is computed there too (`time() - timestamp(...)`): the operator's
clock plays no part, so a skew or a step of it neither makes old data look fresh nor fresh data
look stale. Anything that
prevents a trustworthy reading raises :class:`MetricsUnavailable` with a CamelCase reason;
the policy then holds instead of guessing.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any

import aiohttp
import yarl
from pagoda.operator.autoscaling.policy import Metrics
from pagoda.operator.autoscaling.rules import selector
from pagoda.runtime import options

API_PATH = "/api/v1/query"


class MetricsUnavailable(Exception):
    """No trustworthy reading: `reason` is CamelCase (PrometheusUnreachable, QueryFailed,
    NoSamples, InvalidSample)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


def queries(namespace: str, name: str, ttft_window: str = "1m") -> dict[str, str]:
    """The PromQL of each input (pure; the tests run them against a real Prometheus)."""
    sel = selector(namespace, name)
    return {
        "ttft_p95": (
            "histogram_quantile(0.95, sum by (le) "
            f"(rate({options.METRIC_TTFT}_bucket{sel}[{ttft_window}])))"
        ),
        "waiting": f"sum({options.METRIC_NUM_REQUESTS_WAITING}{sel})",
        "running": f"sum({options.METRIC_NUM_REQUESTS_RUNNING}{sel})",
        "kv_cache": f"max({options.METRIC_KV_CACHE_USAGE}{sel})",
        "age": f"time() - max(timestamp({options.METRIC_NUM_REQUESTS_WAITING}{sel}))",
    }


def prompt_len_query(namespace: str, name: str, window: str = "1m") -> str:
    """Mean prompt length of the recent requests (for the prefill floor of a tuned service).

    The runtime counts a request's prompt tokens when its first token comes, so they are divided
    by the first tokens of the same window (the TTFT histogram's count), not by the finished
    requests: under a burst those lag the first tokens by the whole decode.
    """
    sel = selector(namespace, name)
    return (
        f"sum(rate({options.METRIC_PROMPT_TOKENS}_total{sel}[{window}])) / "
        f"sum(rate({options.METRIC_TTFT}_count{sel}[{window}]))"
    )


# Seconds. The 15 s rate feeds the burst floor and needs a scrape every 5 s (three samples in
# the window; the operator's and the chart's ServiceMonitor scrape so); on a slower scrape it
# has no value and the burst floor stays off.
ARRIVAL_WINDOWS = {"arrival_rate": 30, "arrival_rate_slow": 120, "arrival_rate_fast": 15}


def samples_query(namespace: str, name: str, window: str = "1m") -> str:
    """Mean samples (`n`) per recent request: the runtime's gauges count sequences (a request
    with `n` samples is `n` of them), its request counters requests; this converts the one to
    the other. 1 when no request started in the window (or a runtime without the histogram)."""
    sel = selector(namespace, name)
    n = options.METRIC_REQUEST_PARAMS_N
    return (
        f"(sum(rate({n}_sum{sel}[{window}])) / sum(rate({n}_count{sel}[{window}])) > 0)"
        " or vector(1)"
    )


def demand_queries(namespace: str, name: str, window: str = "1m") -> dict[str, str]:
    """The demand floor's inputs (a service whose tuned profile gives V_P and V_D), all in
    **requests** (a prompt with its `n` samples; docs/operator.md#autoscaling):

    * `arrival_rate`, `arrival_rate_slow`, `arrival_rate_fast`: requests arriving per second over
      30 s, 2 min and 15 s.
      Every request that arrived in the window has either finished or is still in flight, so
      arrivals = finished + the change in running + waiting (no new runtime counter needed);
      the in-flight gauges count sequences, so their change is divided by the mean `n`
      (`samples_per_request`);
    * `output_len`: mean output tokens of the recent requests (all their samples' together);
    * `samples_per_request`: the mean `n` of the recent requests (1 without any).
    """
    sel = selector(namespace, name)
    done = f"{options.METRIC_REQUEST_SUCCESS}_total{sel}"
    per_request = samples_query(namespace, name, window)
    out = {}
    for key, s in ARRIVAL_WINDOWS.items():
        in_flight = " + ".join(
            f"sum(delta({m}{sel}[{s}s]))"
            for m in (options.METRIC_NUM_REQUESTS_RUNNING, options.METRIC_NUM_REQUESTS_WAITING)
        )
        out[key] = f"sum(increase({done}[{s}s])) / {s} + ({in_flight}) / {s} / ({per_request})"
    out["output_len"] = (
        f"sum(rate({options.METRIC_GENERATION_TOKENS}_total{sel}[{window}])) / "
        f"sum(rate({done}[{window}]))"
    )
    out["samples_per_request"] = per_request
    return out


def _positive(value: float | None) -> float | None:
    """A mean or rate that exists: None for no requests (NaN), x/0 (±Inf) or nonsense."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _rate(value: float | None) -> float | None:
    """An arrival rate: None when unknown or not finite, else at least 0."""
    return max(value, 0.0) if value is not None and math.isfinite(value) else None


def check_samples(got: Mapping[str, float | None]) -> None:
    """The inputs every decision rests on must be real numbers: a ±Inf (or a negative TTFT)
    is a broken exporter or recording rule, not a load; hold (InvalidSample) instead of
    scaling on it. The optional inputs (lengths, rates) just turn their floor off."""
    for key in ("ttft_p95", "waiting", "kv_cache", "age"):
        value = got.get(key)
        if value is not None and (not math.isfinite(value) or (key == "ttft_p95" and value < 0)):
            raise MetricsUnavailable("InvalidSample", f"the {key} query answered {value!r}")


# Prometheus' errorType values (web/api/v1): the only part of an error answer a message quotes.
# Conditions and Events never echo a response body: the URL may be a spec's, and its answer
# is none of the reader's business beyond what failed.
ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found"}
)


def _error_type(body: Any) -> str:
    """`(errorType)` of a Prometheus error answer when it is a known one, else ""."""
    kind = body.get("errorType") if isinstance(body, Mapping) else None
    return f" ({kind})" if kind in ERROR_TYPES else ""


def scalar(body: Mapping[str, Any]) -> float | None:
    """The single value of an instant-vector answer; None for no series or NaN.

    Raises MetricsUnavailable for an error answer or an unexpected shape.
    """
    if not isinstance(body, Mapping) or body.get("status") != "success":
        error = isinstance(body, Mapping) and body.get("status") == "error"
        what = f"error answer{_error_type(body)}" if error else "unexpected answer"
        raise MetricsUnavailable("QueryFailed", what)
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise MetricsUnavailable("QueryFailed", f"expected a vector, got {type(data).__name__}")
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        raise MetricsUnavailable("QueryFailed", f"expected a vector, got {data.get('resultType')}")
    if not result:
        return None
    if len(result) > 1:  # every query aggregates to one series: more is a proxy's merge (Thanos
        # without deduplication, a federation) or another query; no telling which is this one's
        raise MetricsUnavailable("QueryFailed", f"expected one series, got {len(result)}")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise MetricsUnavailable("QueryFailed", "malformed sample") from e
    return None if math.isnan(value) else value


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")


def _redacted(url: str) -> str:
    """`url` without a user and password (a Prometheus behind basic auth: http://user:pw@host)."""
    return _USERINFO.sub(r"\1", url)


def query_url(base_url: str) -> yarl.URL:
    """`base_url`'s `/api/v1/query`: the path joined (a base path kept, `..` resolved), any query
    or fragment dropped (the spec and the settings refuse them: a `?` once swallowed the path)."""
    base = yarl.URL(base_url)
    return base.with_query(None).with_fragment(None).with_path(base.path.rstrip("/") + API_PATH)


def url_allowed(base_url: str, prefixes: tuple[str, ...] | None) -> bool:
    """Whether the queries of `base_url` go under one of `prefixes` (None: anywhere): the same
    scheme, host and port, and the query path inside a prefix's path, compared after
    normalisation (so `http://prom/x/../admin` is not under `http://prom/x`)."""
    if prefixes is None:
        return True
    try:
        target = query_url(base_url)
    except ValueError:
        return False
    for prefix in prefixes:
        allowed = yarl.URL(prefix)
        # yarl fills in the port 80 / 443 of http / https, and lowers scheme and host
        same_origin = (target.scheme, target.host, target.port) == (
            allowed.scheme,
            allowed.host,
            allowed.port,
        )
        under = allowed.path.rstrip("/")
        if same_origin and (not under or target.path.startswith(under + "/")):
            return True
    return False


async def _json_or_none(response: aiohttp.ClientResponse) -> Any:
    try:
        return await response.json(content_type=None)
    except ValueError:  # a proxy's text or HTML
        return None


class PrometheusSource:
    """A small Prometheus query client; create inside the event loop, `close()` when done."""

    def __init__(self, *, timeout_s: float = 5.0, ttft_window: str = "1m") -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._ttft_window = ttft_window
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _query(self, base_url: str, promql: str) -> float | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = query_url(base_url)
        shown = _redacted(str(url))  # messages go to conditions, Events and logs
        try:
            # no redirects: the allow-list checks the URL asked, not where an answer points
            async with self._session.get(url, params={"query": promql}, allow_redirects=False) as r:
                if r.status >= 500 or 300 <= r.status < 400 or r.status in (401, 403, 404):
                    why = _error_type(await _json_or_none(r))
                    raise MetricsUnavailable("QueryFailed", f"HTTP {r.status} from {shown}{why}")
                body = await r.json(content_type=None)
        except asyncio.TimeoutError as e:  # a slow Prometheus: say so, not "TimeoutError()"
            limit = self._timeout.total
            raise MetricsUnavailable(
                "PrometheusUnreachable", f"{shown}: no answer within {limit:g} s"
            ) from e
        except (aiohttp.ClientError, OSError) as e:
            error = repr(e).replace(str(url), shown).replace(base_url, _redacted(base_url))
            raise MetricsUnavailable("PrometheusUnreachable", f"{shown}: {error}") from e
        except ValueError as e:
            raise MetricsUnavailable("QueryFailed", f"{shown}: not JSON") from e
        return scalar(body)

    async def fetch(
        self,
        base_url: str,
        namespace: str,
        name: str,
        *,
        prompt_len: bool = False,
        demand: bool = False,
    ) -> Metrics:
        """The current reading for one InferenceService, or MetricsUnavailable. `prompt_len`:
        also the mean prompt length, for the queued prompt tokens of the prefill floor;
        `demand`: also the arrival rates and the mean output length (the demand floor)."""
        q = queries(namespace, name, self._ttft_window)
        if prompt_len or demand:
            q["prompt_len"] = prompt_len_query(namespace, name, self._ttft_window)
            q["samples_per_request"] = samples_query(namespace, name, self._ttft_window)
        if demand:
            q.update(demand_queries(namespace, name, self._ttft_window))
        keys = list(q)
        values = await asyncio.gather(*(self._query(base_url, q[k]) for k in keys))
        got = dict(zip(keys, values))
        check_samples(got)
        if got["waiting"] is None or got["age"] is None:
            raise MetricsUnavailable(
                "NoSamples",
                f"no {options.METRIC_NUM_REQUESTS_WAITING} series for {namespace}/{name} "
                "(not scraped yet, or the namespace/inferenceservice labels are missing)",
            )
        isl = _positive(got.get("prompt_len"))  # NaN: no requests
        per_request = max(_positive(got.get("samples_per_request")) or 1.0, 1.0)
        waiting = max(got["waiting"], 0.0)
        rates = {k: got.get(k) for k in ARRIVAL_WINDOWS}
        return Metrics(
            ttft_p95_s=got["ttft_p95"],
            waiting=waiting,
            running=_rate(got.get("running")),  # None when unknown: then only `waiting` counts
            kv_cache_usage=got["kv_cache"],
            age_s=max(got["age"], 0.0),
            # the waiting sequences' requests: a request's samples share its prompt's prefill
            queued_prompt_tokens=None if isl is None else waiting / per_request * isl,
            mean_prompt_tokens=isl,
            mean_output_tokens=_positive(got.get("output_len")),
            samples_per_request=per_request,
            **{k: _rate(v) for k, v in rates.items()},
        )
