"""Thin kopf handlers: translate kopf's world (bodies, retries, errors) into reconcile.py calls.

* create / update(spec) / resume of an InferenceService → full reconcile;
  a spec problem → `Degraded` + Event + `kopf.PermanentError` (no retry storm);
  an API hiccup → `kopf.TemporaryError` with exponential backoff.
* events of the children (Deployment, Service, ConfigMap, PDB labelled as ours) → restore a
  deleted or hand-edited child; a Deployment change refreshes the owner's status.
* a resync loop (started at startup) re-reconciles everything every `resync_interval_s`;
* every failure of these is retried with backoff by the path that needed it (retry.py);
* the autoscaler loop (autoscaling/loop.py, started at startup) evaluates every
  `autoscale_interval_s`;
* the autotuning loop (autotune/loop.py, started at startup unless `--no-autotune`) looks at
  tuning Jobs and profiles every `autotune_interval_s`.

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
from pagoda.operator.autotune.loop import Autotuner
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
from pagoda.operator.retry import Reconciler, backoff

log = logging.getLogger(__name__)


# --- kopf handlers (registered by build_registry) --------------------------------------------


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


async def startup(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    config: OperatorConfig = memo.config
    if getattr(memo, "api", None) is None:
        memo.api = KubeApi(
            request_timeout_s=config.request_timeout_s, connect_timeout_s=config.connect_timeout_s
        )
    memo.reconciler = Reconciler(memo.api, config, getattr(memo, "metrics", None))
    memo.resync_task = asyncio.create_task(
        resync_loop(memo.reconciler, logger), name="pagoda-resync"
    )
    autoscaler = getattr(memo, "autoscaler", None)
    if autoscaler is not None:
        memo.autoscale_task = asyncio.create_task(autoscaler.run(), name="pagoda-autoscale")
    if config.autotune:
        memo.autotune_task = asyncio.create_task(
            autotune_loop(memo, logger).run(), name="pagoda-autotune"
        )
    logger.info(
        "Pagoda operator started (%s, default image %s).",
        "cluster-wide" if config.clusterwide else "namespaces " + ",".join(config.namespaces),
        config.default_image,
    )


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for name in ("resync_task", "autoscale_task", "autotune_task"):
        task = getattr(memo, name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if getattr(memo, "reconciler", None) is not None:
        await memo.reconciler.close()
    if getattr(memo, "api", None) is not None:
        await memo.api.close()


def autotune_loop(memo: kopf.Memo, logger: logging.Logger) -> Autotuner:
    """The autotuning loop; a changed `status.autotune` reconciles the service (mount)."""

    async def reconcile_now(body: Mapping[str, Any]) -> None:
        await memo.reconciler.run(copy.deepcopy(dict(body)), logger, 0, "autotune")

    return Autotuner(memo.api, memo.config, reconcile_now)


def isvc_index(
    namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest body of every InferenceService, for the child-event handler."""
    return {(namespace, name): copy.deepcopy(dict(body))}


async def reconcile_isvc(
    body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, retry: int, **_: Any
) -> None:
    await memo.reconciler.run(copy.deepcopy(dict(body)), logger, retry, "handler")


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
        # kopf never retries event handlers: reconcile the owner again, with backoff
        logger.warning(
            "Handling the %s event of %s %s failed: %s; reconciling %s %s again in %.0f s.",
            type, body.get("kind"), meta.get("name"), e, KIND, owner["metadata"]["name"], backoff(0),
        )  # fmt: skip
        if metrics is not None:
            metrics.reconcile_errors.labels("child_event", "transient").inc()
        memo.reconciler.schedule(owner, "child_event", backoff(0), 1)
    finally:
        if metrics is not None:
            metrics.reconcile_duration.labels("child_event").observe(time.perf_counter() - started)


async def resync_loop(reconciler: Reconciler, logger: logging.Logger) -> None:
    """Re-reconcile every InferenceService periodically; heals what no event announced.

    A failed reconcile is followed up with backoff (`Reconciler.run` schedules it), not left
    to the next resync.
    """
    config = reconciler.config
    while True:
        await asyncio.sleep(config.resync_interval_s)
        try:
            bodies = await reconciler.api.list_all(KIND, config.namespaces)
        except ApiError as e:
            logger.warning("Resync could not list %s objects: %s", KIND, e)
            continue
        reconciler.keep_only({b["metadata"]["uid"] for b in bodies})
        for body in bodies:
            try:
                await reconciler.run(body, logger, 0, "resync")
            except kopf.TemporaryError as e:
                logger.warning("Resync of %s: %s", body["metadata"].get("name"), e)
            except kopf.PermanentError as e:
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
