"""Thin kopf handlers: translate kopf's world (bodies, retries, errors) into reconcile.py calls.

* create / update(spec) / resume of an InferenceService → full reconcile;
  a spec problem → `Degraded` + Event + `kopf.PermanentError` (no retry storm);
  an API hiccup → `kopf.TemporaryError` with exponential backoff.
* events of the children (Deployment, Service, ConfigMap, PDB labelled as ours) → restore a
  deleted or hand-edited child; a Deployment change refreshes the owner's status.
* a resync loop (started at startup) re-reconciles everything every `resync_interval_s`;
* the autoscaler loop (autoscaler.py, started at startup) evaluates every `autoscale_interval_s`.

No timers or delete handlers, so kopf puts no finalizer on the CRs: deletion never waits for
the operator, and the garbage collector removes the children through their owner references.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf
from pagoda.operator import reconcile
from pagoda.operator.config import OperatorConfig
from pagoda.operator.k8s import ApiError, KubeApi
from pagoda.operator.names import (
    ISVC,
    KIND,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    RESOURCES,
    WATCHED_CHILD_KINDS,
)
from pagoda.operator.operator_metrics import OperatorMetrics
from pagoda.operator.reconcile import ChildConflict

log = logging.getLogger(__name__)


def backoff(retry: int) -> float:
    """Seconds before retry number `retry` (0-based): 1, 2, 4, ... capped at a minute."""
    return min(2.0 ** max(retry, 0), 60.0)


async def run_reconcile(
    body: Mapping[str, Any],
    api: KubeApi,
    config: OperatorConfig,
    logger: logging.Logger,
    retry: int,
    metrics: OperatorMetrics | None = None,
    trigger: str = "handler",
) -> None:
    """Reconcile and map the outcome to kopf's error semantics."""
    started = time.perf_counter()
    try:
        result = await reconcile.reconcile(api, body, config, logger)
    except ApiError as e:
        raise kopf.TemporaryError(
            f"Kubernetes API call failed, retrying: {e}", delay=backoff(retry)
        ) from e
    finally:
        if metrics is not None:
            metrics.reconcile_duration.labels(trigger).observe(time.perf_counter() - started)
    err = result.spec_error
    if err is None:
        if result.status_changed:
            logger.info("Reconciled %s %s.", KIND, body["metadata"]["name"])
        return
    if result.status_changed:
        await api.try_post_event(
            body,
            type_="Warning",
            reason=err.reason,
            message=err.message,
            component=config.component_name,
        )
    if isinstance(err, ChildConflict):  # the garbage collector may free the name: try again later
        raise kopf.TemporaryError(err.message, delay=max(backoff(retry), 10.0))
    raise kopf.PermanentError(f"{err.reason}: {err.message}")


# --- kopf handlers (registered by build_registry) --------------------------------------------


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


async def startup(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    config: OperatorConfig = memo.config
    if getattr(memo, "api", None) is None:
        memo.api = KubeApi(
            request_timeout_s=config.request_timeout_s, connect_timeout_s=config.connect_timeout_s
        )
    metrics = getattr(memo, "metrics", None)
    memo.resync_task = asyncio.create_task(
        resync_loop(memo.api, config, logger, metrics), name="pagoda-resync"
    )
    autoscaler = getattr(memo, "autoscaler", None)
    if autoscaler is not None:
        memo.autoscale_task = asyncio.create_task(autoscaler.run(), name="pagoda-autoscale")
    logger.info(
        "Pagoda operator started (%s, default image %s).",
        "cluster-wide" if config.clusterwide else "namespaces " + ",".join(config.namespaces),
        config.default_image,
    )


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for name in ("resync_task", "autoscale_task"):
        task = getattr(memo, name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if getattr(memo, "api", None) is not None:
        await memo.api.close()


def isvc_index(
    namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest body of every InferenceService, for the child-event handler."""
    return {(namespace, name): copy.deepcopy(dict(body))}


async def reconcile_isvc(
    body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, retry: int, **_: Any
) -> None:
    await run_reconcile(
        copy.deepcopy(dict(body)),
        memo.api,
        memo.config,
        logger,
        retry,
        getattr(memo, "metrics", None),
    )


async def child_event(
    type: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: logging.Logger,
    isvc_index: kopf.Index,
    **_: Any,
) -> None:
    meta = body.get("metadata") or {}
    owner_name = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    store = isvc_index.get((meta.get("namespace"), owner_name)) if owner_name else None
    owner = next(iter(store), None) if store else None
    if owner is None:
        return
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    started = time.perf_counter()
    try:
        await reconcile.on_child_event(
            memo.api, type, copy.deepcopy(dict(body)), owner, memo.config, logger
        )
    except (ApiError, ChildConflict) as e:
        logger.warning(
            "Could not restore %s %s: %s (the resync will retry).",
            body.get("kind"),
            meta.get("name"),
            e,
        )
    finally:
        if metrics is not None:
            metrics.reconcile_duration.labels("child_event").observe(time.perf_counter() - started)


async def resync_loop(
    api: KubeApi,
    config: OperatorConfig,
    logger: logging.Logger,
    metrics: OperatorMetrics | None = None,
) -> None:
    """Re-reconcile every InferenceService periodically; heals what no event announced."""
    while True:
        await asyncio.sleep(config.resync_interval_s)
        try:
            bodies = await api.list_all(KIND, config.namespaces)
        except ApiError as e:
            logger.warning("Resync could not list %s objects: %s", KIND, e)
            continue
        for body in bodies:
            try:
                await run_reconcile(body, api, config, logger, 0, metrics, "resync")
            except (kopf.TemporaryError, kopf.PermanentError) as e:
                logger.debug("Resync of %s: %s", body["metadata"].get("name"), e)


def build_registry() -> kopf.OperatorRegistry:
    """All handlers in a fresh registry (no global state, so tests can run several operators).

    Handlers find the OperatorConfig and the KubeApi in kopf's `memo` (see main.serve).
    """
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.index(*ISVC, registry=registry)(isvc_index)
    kopf.on.resume(*ISVC, registry=registry)(reconcile_isvc)
    kopf.on.create(*ISVC, registry=registry)(reconcile_isvc)
    kopf.on.update(*ISVC, registry=registry)(
        reconcile_isvc
    )  # spec, labels, annotations (not status)
    for kind in WATCHED_CHILD_KINDS:
        res = RESOURCES[kind]
        kopf.on.event(
            res.group,
            res.version,
            res.plural,
            labels={LABEL_MANAGED_BY: MANAGED_BY},
            registry=registry,
        )(child_event)
    return registry
