"""The operator's own HTTP port: liveness (/healthz) and readiness (/readyz).

/readyz is 503 while kopf starts, once the API server has failed every call for
`api_unready_after_s` (the autoscaler lists the InferenceServices every interval, so an outage
shows within one interval), and once the status of some InferenceService could not be written for
that long (a status write refused, say with a 422 from a CRD older than the operator: the users of
that service see nothing new, and the reconciler keeps retrying it with backoff). /healthz stays
200 then: restarting cannot fix either.
One aiohttp application: other modules add routes (/metrics, POST /alerts) with `add_routes`.

With kopf peering, /readyz says `"peering": "active"` or `"standby"` but its status code does not
depend on it: a standby replica is healthy, and an unready one would stall rollouts,
`helm --wait` and the PodDisruptionBudget (the Service picks the active pod by a label instead).
With `tls` (PEM certificate and key files) the port serves HTTPS only; the files are read again
when they change (a renewed Secret), checked at most every `TLS_RELOAD_S` seconds.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Iterable

from aiohttp import web

# (seconds failing, "namespace/name", the last error) of the status write failing the longest
StatusFailure = tuple[float, str, Exception]
TLS_RELOAD_S = 60.0
log = logging.getLogger(__name__)


class ReloadingTls:
    """The server's SSLContext; a handshake after the cert/key files changed (by mtime, looked
    at most every `TLS_RELOAD_S`) gets a context with the new ones (`sni_callback` may swap
    the connection's context, so the change applies from that very handshake)."""

    def __init__(self, cert: str, key: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cert, self.key, self._clock = cert, key, clock
        self._stamp = self._mtimes()
        self.context = self._load()  # a bad file fails the start, with its error
        self.context.sni_callback = self._maybe_reload
        self._current = self.context
        self._checked = clock()

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime

    def _maybe_reload(self, connection: ssl.SSLObject, *_: object) -> None:
        if self._clock() - self._checked >= TLS_RELOAD_S:
            self._checked = self._clock()
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._current, self._stamp = self._load(), stamp
                    log.info("Reloaded the TLS certificate %s.", self.cert)
            except (OSError, ssl.SSLError) as e:  # keep serving the loaded one
                log.warning("Cannot reload the TLS certificate %s: %s", self.cert, e)
        if self._current is not self.context:
            connection.context = self._current


class OperatorHttpServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        is_alive: Callable[[], bool],
        is_ready: Callable[[], bool],
        api_unreachable_for: Callable[[], float] = lambda: 0.0,
        api_unready_after_s: float = 60.0,
        status_unwritable: Callable[[], StatusFailure | None] = lambda: None,
        peering_role: Callable[[], bool] | None = None,
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.app = web.Application()
        self.app.add_routes([web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)])
        self._is_alive = is_alive
        self._is_ready = is_ready
        self._api_unreachable_for = api_unreachable_for
        self._api_unready_after_s = api_unready_after_s
        self._status_unwritable = status_unwritable
        self._peering_role = peering_role
        self.tls = ReloadingTls(*tls) if tls is not None else None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def add_routes(self, routes: Iterable[web.AbstractRouteDef]) -> None:
        """Extra endpoints; call before `start()`."""
        self.app.add_routes(list(routes))

    async def _healthz(self, _: web.Request) -> web.Response:
        alive = self._is_alive()
        return web.json_response(
            {"status": "ok" if alive else "stopped"}, status=200 if alive else 503
        )

    async def _readyz(self, _: web.Request) -> web.Response:
        if not (self._is_alive() and self._is_ready()):
            return web.json_response({"status": "starting"}, status=503)
        down = self._api_unreachable_for()
        if down >= self._api_unready_after_s:
            body = {"status": "api-unreachable", "unreachableSeconds": round(down, 1)}
            return web.json_response(body, status=503)
        failing = self._status_unwritable()
        if failing is not None and failing[0] >= self._api_unready_after_s:
            seconds, where, error = failing
            body = {
                "status": "status-unwritable",
                "failingSeconds": round(seconds, 1),
                "inferenceService": where,
                "error": str(error)[:1024],
            }
            return web.json_response(body, status=503)
        body = {"status": "ready"}
        if self._peering_role is not None:
            body["peering"] = "active" if self._peering_role() else "standby"
        return web.json_response(body)

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.requested_port,
            ssl_context=self.tls.context if self.tls is not None else None,
        )
        await site.start()
        addresses = self._runner.addresses
        self.port = addresses[0][1] if addresses else self.requested_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
