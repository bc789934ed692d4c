"""A stand-in for Prometheus' /api/v1/query, answering the autoscaler's four queries from a dict.

For fast tests of the operator's loop against the emulator; the real Prometheus is exercised by
test_autoscale_e2e.py. Each query is recorded so tests can check the label matchers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web


class FakePrometheus:
    def __init__(self) -> None:
        self.ttft: float | None = 0.1  # None: no first tokens in the window (NaN)
        self.waiting: float | None = 0.0  # None: no series at all
        self.running = 0.0
        self.kv_cache = 0.2
        self.arrival_rate: float | None = None  # the demand floor's inputs; None: no data
        self.output_len: float | None = None
        self.samples_per_request: float | None = None  # mean n; None: no data (vector(1))
        self.age_s = 0.0
        self.status = 200  # e.g. 503 to fail every query
        self.delay = 0.0  # seconds each answer takes (a slow Prometheus)
        self.queries: list[str] = []
        self.ttft_answers: list[tuple[float, float | None]] = []  # (monotonic time, value)
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _value(self, q: str) -> float | None:
        if "histogram_quantile" in q:
            self.ttft_answers.append((time.monotonic(), self.ttft))
            return float("nan") if self.ttft is None else self.ttft
        if self.waiting is None:
            return None
        if "increase(pagoda:request_success_total" in q:  # arrivals (both windows)
            return self.arrival_rate
        if q.startswith("(sum(rate(pagoda:request_params_n_sum"):  # mean n
            return 1.0 if self.samples_per_request is None else self.samples_per_request
        if "generation_tokens_total" in q:
            return self.output_len
        if q.startswith("time() - max(timestamp("):  # the age of the newest sample
            return self.age_s
        if "num_requests_waiting" in q:
            return self.waiting
        if "num_requests_running" in q:
            return self.running
        if "kv_cache_usage_perc" in q:
            return self.kv_cache
        raise AssertionError(f"unexpected query {q}")

    async def _query(self, request: web.Request) -> web.Response:
        q = request.query["query"]
        self.queries.append(q)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            error = {"status": "error", "errorType": "timeout",
                     "error": "query timed out in expression evaluation"}  # fmt: skip
            return web.json_response(error, status=self.status)
        at = float(request.query.get("time", time.time()))
        value = self._value(q)
        result: list[dict[str, Any]] = []
        if value is not None:
            result = [{"metric": {}, "value": [at, repr(value) if value == value else "NaN"]}]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/api/v1/query", self._query)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
