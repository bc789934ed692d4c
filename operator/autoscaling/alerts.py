"""Alertmanager webhook receiver: POST /alerts turns firing `pagoda_action="scale_up"` alerts into
one immediate scale-up step per InferenceService.

The whole payload is validated before anything is acted on, so a malformed or unknown payload
gets 400 and changes nothing. Alerts without `pagoda_action` (other routes may share the
receiver) and resolved alerts are accepted and ignored. With a token configured, callers must
send `Authorization: Bearer TOKEN` (Alertmanager's `http_config.authorization`). With several
replicas (kopf peering) only the active one acts: a standby one answers 503 and closes the
connection, so Alertmanager's retry goes through the Service again (which selects the active
pod by its `serving.pagoda.dev/peering=active` label, kube/peering.py).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pagoda.operator.kube.client import ApiError

if TYPE_CHECKING:
    from pagoda.operator.web.metrics import OperatorMetrics

ACTIONS = ("scale_up",)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # namespaces and InferenceServices
MAX_BODY_BYTES = 1 << 20
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaleUpRequest:
    namespace: str
    name: str
    alertname: str

    def __post_init__(self) -> None:
        if not self.namespace or not self.name:
            raise ValueError("namespace and inferenceservice labels must be non-empty")


def parse_payload(payload: Any) -> list[ScaleUpRequest]:
    """Scale-up requests in an Alertmanager (version 4) payload, one per InferenceService.

    Raises ValueError when the payload is not one Alertmanager sends, or a scale-up alert lacks
    the labels that say which InferenceService it is about.
    """
    if not isinstance(payload, Mapping):
        raise ValueError("payload must be a JSON object")
    if payload.get("version") != "4":
        raise ValueError(f"unknown payload version {payload.get('version')!r} (expected '4')")
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("alerts must be a list")
    requests: dict[tuple[str, str], ScaleUpRequest] = {}
    for i, alert in enumerate(alerts):
        if not isinstance(alert, Mapping):
            raise ValueError(f"alerts[{i}] must be an object")
        status, labels = alert.get("status"), alert.get("labels")
        if status not in ("firing", "resolved"):
            raise ValueError(f"alerts[{i}].status must be firing or resolved, got {status!r}")
        if not isinstance(labels, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ValueError(f"alerts[{i}].labels must map strings to strings")
        action = labels.get("pagoda_action")
        if action is None:
            continue
        if action not in ACTIONS:
            raise ValueError(f"alerts[{i}]: unknown pagoda_action {action!r}")
        namespace, name = labels.get("namespace", ""), labels.get("inferenceservice", "")
        if not namespace or not name:
            raise ValueError(f"alerts[{i}]: a {action} alert needs namespace and inferenceservice")
        for label, value in (("namespace", namespace), ("inferenceservice", name)):
            if len(value) > 63 or not _DNS_LABEL.match(value):  # they go into API paths
                raise ValueError(f"alerts[{i}]: {label} {value[:80]!r} is not a DNS label")
        if status == "firing":
            key = (namespace, name)
            requests.setdefault(key, ScaleUpRequest(namespace, name, labels.get("alertname", "")))
    return list(requests.values())


ScaleUp = Callable[[ScaleUpRequest], Awaitable[str]]


def authorized(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)


class AlertReceiver:
    """The POST /alerts handler; `scale_up` performs one step and returns its outcome."""

    def __init__(
        self,
        scale_up: ScaleUp,
        *,
        token: str | None,
        metrics: OperatorMetrics,
        is_active: Callable[[], bool] = lambda: True,
    ) -> None:
        self._scale_up = scale_up
        self._token = token
        self._metrics = metrics
        self._is_active = is_active

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/alerts", self.handle)]

    def _reply(self, status: int, outcome: str, **body: Any) -> web.Response:
        self._metrics.alerts.labels(outcome).inc()
        return web.json_response({"status": outcome, **body}, status=status)

    async def handle(self, request: web.Request) -> web.Response:
        if not authorized(request.headers.get("Authorization"), self._token):
            return self._reply(401, "unauthorized", error="missing or wrong bearer token")
        if not self._is_active():
            # A standby replica (kopf peering) must not act: 503 makes Alertmanager retry, and
            # a closed connection lets the retry reach the active replica through the Service.
            response = self._reply(503, "standby", error="this operator replica is standing by")
            response.force_close()
            return response
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return self._reply(413, "rejected", error="payload too large")
        try:
            payload = json.loads(await request.read())
            wanted = parse_payload(payload)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("Rejected an Alertmanager payload: %s", e)
            return self._reply(400, "rejected", error=str(e))
        results = []
        for req in wanted:
            try:
                outcome = await self._scale_up(req)
            except ApiError as e:  # Alertmanager retries 5xx: the step is worth retrying
                log.warning("Alert %s for %s/%s: %s", req.alertname, req.namespace, req.name, e)
                return self._reply(503, "retry", error=str(e), results=results)
            results.append(
                {"namespace": req.namespace, "inferenceservice": req.name, "outcome": outcome}
            )
        return self._reply(200, "ok" if results else "ignored", results=results)
