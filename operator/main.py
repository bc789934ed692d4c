"""`pagoda operator`: kopf in-process with explicit settings, plus a liveness/readiness port.

    pagoda operator                      # cluster-wide
    pagoda operator -n team-a -n team-b  # only these namespaces
    pagoda operator --log-format json --http-port 8080
    pagoda operator --prometheus-url http://prometheus:9090 --webhook-token-file /etc/token

`serve(config)` is the whole operator as a coroutine (the end-to-end tests run it directly): it
builds the parts (API client, reconciler, autoscaler, autotuner, metrics) into kopf's `memo`, runs
kopf with the handlers of handlers.py, and one HTTP port with /healthz, /readyz, /metrics and
POST /alerts.
`run(args)` adds logging setup and `asyncio.run`. SIGTERM/SIGINT stop it cleanly (kopf). The flags
and the `OperatorConfig` they make are flags.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import kopf
from pagoda.operator import handlers  # noqa: F401  (importing it registers the kopf handlers)
from pagoda.operator.autoscaling.alerts import AlertReceiver
from pagoda.operator.autoscaling.loop import Autoscaler
from pagoda.operator.autotune.loop import Autotuner
from pagoda.operator.children.model_cache import add_model_download
from pagoda.operator.flags import add_arguments, config_from_args
from pagoda.operator.kube.client import KubeApi
from pagoda.operator.kube.names import (
    LABEL_MANAGED_BY,
    MANAGED_BY,
    RESOURCES,
    WATCHED_CHILD_KINDS,
    pod_labels,
)
from pagoda.operator.kube.peering import PeeringGate, auto_priority, default_identity
from pagoda.operator.reconcile import model_pin
from pagoda.operator.reconcile.retry import Reconciler
from pagoda.operator.web.metrics import OperatorMetrics
from pagoda.operator.web.server import OperatorHttpServer, StatusFailure

if TYPE_CHECKING:
    from pagoda.operator.spec.config import OperatorConfig

STORAGE_PREFIX = "serving.pagoda.dev"
log = logging.getLogger(__name__)
__all__ = ["add_arguments", "kopf_settings", "run", "serve"]  # add_arguments: flags.py's


def kopf_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    """Kopf settings: timeouts, annotation-only state (the status schema stays ours), events."""
    s = kopf.OperatorSettings()
    s.watching.server_timeout = config.watch_timeout_s
    s.watching.client_timeout = config.watch_timeout_s + 30
    s.watching.connect_timeout = config.connect_timeout_s
    s.networking.request_timeout = config.request_timeout_s
    s.networking.connect_timeout = config.connect_timeout_s
    s.persistence.finalizer = f"{STORAGE_PREFIX}/finalizer"
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=STORAGE_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=STORAGE_PREFIX, key="last-handled-configuration"
    )
    # kopf (>= 1.45) posts no Events from log lines unless `posting.loggers` is on; the operator
    # posts its own (spec errors, refused status writes, tuning failures, scaling), and kopf's
    # explicit event calls stay at WARNING and above.
    s.posting.level = logging.WARNING
    s.posting.reporting_component = config.component_name
    s.posting.reporting_instance = os.environ.get("HOSTNAME", config.component_name)
    s.peering.standalone = config.peering is None
    s.peering.name = config.peering or "default"
    s.peering.lifetime = config.peering_lifetime_s
    s.peering.clusterwide = config.clusterwide
    # Watch only our children (server-side label selector; kopf >= 1.45 has the setting).
    selectors = getattr(s.watching, "label_selectors", None)
    if selectors is not None:
        for kind in WATCHED_CHILD_KINDS:
            res = RESOURCES[kind]
            selectors[res.group, res.plural] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        pods = RESOURCES["Pod"]
        selectors[pods.group, pods.plural] = ",".join(f"{k}={v}" for k, v in pod_labels().items())
    return s


async def serve(
    config: OperatorConfig,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    api: KubeApi | None = None,
    on_http_started: Callable[[int], None] | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (or SIGTERM/SIGINT in the main thread).

    Kopf cancels every task created in the loop after it starts when it stops, so give it a
    loop of its own (as `run` does, or a thread in tests).
    """
    ready = ready_flag if ready_flag is not None else asyncio.Event()
    metrics = OperatorMetrics()
    if api is None:
        api = KubeApi(
            request_timeout_s=config.request_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            on_error=lambda status, verb: metrics.api_errors.labels(str(status), verb).inc(),
        )
    autoscaler = Autoscaler(api, config, metrics)
    gate = _peering_gate(config, api, metrics)
    reconciler = Reconciler(api, config, metrics, active=lambda: gate.active)
    autotuner = (
        Autotuner(
            api,
            config,
            reconciler.after_autotune,
            pod_parts=add_model_download,
            pin=model_pin.recorded_model_spec,
        )
        if config.autotune
        else None
    )
    memo = kopf.Memo(
        config=config,
        api=api,
        metrics=metrics,
        reconciler=reconciler,
        autoscaler=autoscaler,
        autotuner=autotuner,
        gate=gate,
    )
    task: asyncio.Task[None] | None = None
    http = None
    if config.http_port is not None:  # before kopf, so the port is known once kopf is ready
        http = await _start_http(
            config,
            metrics,
            autoscaler,
            lambda: task is None or not task.done(),
            ready.is_set,
            lambda: api.unreachable_for() if api is not None else 0.0,
            api.status_unwritable,
            gate,
        )
        if on_http_started is not None:
            on_http_started(http.port or 0)
    task = asyncio.create_task(
        kopf.operator(
            settings=kopf_settings(config),
            clusterwide=config.clusterwide,
            namespaces=list(config.namespaces),
            standalone=config.peering is None,
            peering_name=config.peering,
            identity=gate.identity,  # type: ignore[arg-type]  (kopf's NewType of str)
            priority=gate.priority,
            stop_flag=stop_flag,
            ready_flag=ready,
            memo=memo,
        ),
        name="kopf-operator",
    )
    try:
        await task
    finally:
        if http is not None:
            await http.stop()
        await autoscaler.close()


def _peering_gate(config: OperatorConfig, api: KubeApi, metrics: OperatorMetrics) -> PeeringGate:
    """Who acts among the replicas (kube/peering.py); always active without `--peering`."""
    pod = None
    if config.pod_name and config.pod_namespace:
        pod = (config.pod_namespace, config.pod_name)
    priority = config.peering_priority
    gate = PeeringGate(
        api,
        name=config.peering,
        namespaces=config.namespaces,
        identity=config.pod_name or default_identity(),
        priority=auto_priority() if priority is None else priority,
        interval_s=config.peering_interval_s,
        lifetime_s=config.peering_lifetime_s,
        pod=pod,
        on_change=metrics.set_role,
    )
    metrics.set_role(gate.active)
    if config.peering is not None:
        log.info("Peering %r as %s, priority %d.", config.peering, gate.identity, gate.priority)
    return gate


async def _start_http(
    config: OperatorConfig,
    metrics: OperatorMetrics,
    autoscaler: Autoscaler,
    is_alive: Callable[[], bool],
    is_ready: Callable[[], bool],
    api_unreachable_for: Callable[[], float],
    status_unwritable: Callable[[], StatusFailure | None],
    gate: PeeringGate,
) -> OperatorHttpServer:
    """The operator's port: /healthz, /readyz, /metrics and the Alertmanager webhook."""
    assert config.http_port is not None
    http = OperatorHttpServer(
        config.http_host,
        config.http_port,
        is_alive=is_alive,
        is_ready=is_ready,
        api_unreachable_for=api_unreachable_for,
        api_unready_after_s=config.api_unready_after_s,
        status_unwritable=status_unwritable,
        peering_role=None if config.peering is None else (lambda: gate.active),
        tls=(config.http_tls_cert, config.http_tls_key) if config.http_tls_cert else None,
    )
    http.add_routes(metrics.routes())
    receiver = AlertReceiver(
        autoscaler.alert_scale_up,
        token=config.webhook_token,
        metrics=metrics,
        is_active=lambda: gate.active,
    )
    http.add_routes(receiver.routes())
    await http.start()
    log.info(
        "Serving /healthz, /readyz, /metrics and POST /alerts%s on %s://%s:%s.",
        " (bearer token required)" if config.webhook_token else "",
        "https" if config.http_tls_cert else "http",
        config.http_host,
        http.port,
    )
    return http


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"pagoda operator: {e}", file=sys.stderr)
        return 2
    log_format = {
        "plain": kopf.LogFormat.PLAIN,
        "full": kopf.LogFormat.FULL,
        "json": kopf.LogFormat.JSON,
    }
    kopf.configure(
        debug=config.debug, verbose=config.verbose, log_format=log_format[config.log_format]
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))
    return 0
