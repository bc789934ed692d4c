"""The emulator with a flaky API server in front: targeted and random faults, dropped watches.

Faults hit only the operator's own requests (kopf's and `pagoda-operator`'s user agents), never
the test's, and never discovery, CRD or namespace requests (what kopf needs to start at all):

* `fail_next(...)`: the next N matching requests get an error, optionally a plain-text or HTML
  body (what a proxy in front of the API server answers) instead of a Status object, optionally
  only those whose body satisfies `when` (a 422 for some content only, as a schema would);
* `chaos(rate, statuses, watch_drop_rate)`: each request fails with one of `statuses` with
  probability `rate` (409 only for writes); each watch is cut after 0.2–2 s with probability
  `watch_drop_rate`;
* `calls`, `injected` and `dropped` count what happened (the operator's requests only).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kmock
from kube_emulator import Emulator, _status
from operator_helpers import OPERATOR_AGENTS

_REASONS = {
    403: "Forbidden",
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
_SPARED = ("customresourcedefinitions", "namespaces")


@dataclass
class Fault:
    method: str
    plural: str
    status: int
    times: int
    subresource: str | None = None
    text: str | None = None  # a non-JSON body (e.g. a proxy's HTML page)
    when: Callable[[Any], bool] | None = None  # only requests whose body satisfies it


class FaultyEmulator(Emulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.targeted: list[Fault] = []
        self.rate = 0.0
        self.statuses: tuple[int, ...] = (500, 429, 409)
        self.watch_drop_rate = 0.0
        self.rng = random.Random(1)
        self.calls = 0
        self.injected: Counter[int] = Counter()
        self.dropped = 0
        self._sure_drops = 0

    def fail_next(
        self,
        method: str,
        plural: str,
        status: int,
        times: int = 1,
        *,
        subresource: str | None = None,
        text: str | None = None,
        when: Callable[[Any], bool] | None = None,
    ) -> Fault:
        fault = Fault(method.upper(), plural, status, times, subresource, text, when)
        self.targeted.append(fault)
        return fault

    def chaos(
        self,
        rate: float,
        statuses: tuple[int, ...] = (500, 429, 409),
        watch_drop_rate: float = 0.0,
    ) -> None:
        self.rate, self.statuses, self.watch_drop_rate = rate, statuses, watch_drop_rate
        self._sure_drops = 2 if watch_drop_rate else 0  # the first watches after this: cut

    def _error(self, status: int, text: str | None) -> aiohttp.web.StreamResponse:
        self.injected[status] += 1
        if text is not None:
            ctype = "text/html" if text.lstrip().startswith("<") else "text/plain"
            return aiohttp.web.Response(status=status, text=text, content_type=ctype)
        raise _status(status, _REASONS.get(status, "InternalError"), "injected fault")

    async def _dropped_watch(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A watch that streams the current objects, then breaks after 0.2-2 s, as when a load
        balancer drops the connection (changes meanwhile reach the client on its next watch,
        which replays every object). Served here, not by kmock: cancelling kmock's stream
        mid-way leaves its event bus locked."""
        self.dropped += 1
        raw = request._raw_request
        response = aiohttp.web.StreamResponse()
        response.content_type = "application/json"
        await response.prepare(raw)
        for obj in self._matching(request):
            await response.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        if raw.transport is not None:
            raw.transport.close()  # no terminating chunk: the client sees a broken stream
        return response

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        agent = request.headers.get("User-Agent", "")
        if res is None or not res.plural or res.plural in _SPARED:
            return await super()._handle(request)
        if not agent.startswith(OPERATOR_AGENTS):
            return await super()._handle(request)
        self.calls += 1
        if request.action == kmock.action.WATCH:
            if self._sure_drops or self.rng.random() < self.watch_drop_rate:
                self._sure_drops = max(0, self._sure_drops - 1)
                return await self._dropped_watch(request)
            return await super()._handle(request)
        for fault in self.targeted:
            if (
                fault.times > 0
                and fault.method == request.method.value
                and fault.plural == res.plural
                and fault.subresource == request.subresource
                and (fault.when is None or fault.when(request.data))
            ):
                fault.times -= 1
                return self._error(fault.status, fault.text)
        if self.rate and self.rng.random() < self.rate:
            # 409 is an answer to writes only: an API server never sends it for a read (and
            # kopf, rightly, treats one on a list as fatal)
            fits = [s for s in self.statuses if s != 409 or request.method.value != "GET"]
            return self._error(self.rng.choice(fits or [500]), None)
        return await super()._handle(request)
