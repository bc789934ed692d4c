"""The kopf handlers, registered at module level as kopf's examples do; importing this module
registers them (main.serve runs kopf with the default registry).

Each handler is thin: it takes what it needs from kopf's arguments and from `memo`, which
main.serve fills (the `OperatorConfig`, the `KubeApi`, the `Reconciler` of reconcile/retry.py,
the autoscaler and the autotuner), and delegates.

* create / update (spec, labels, annotations) / resume of an InferenceService → one reconcile;
  a spec problem → `Degraded` + Event + `kopf.PermanentError` (no retry storm), an API hiccup →
  `kopf.TemporaryError` with exponential backoff (both decided by the Reconciler);
* events of the children (Deployment, Service, ConfigMap, PDB labelled as ours) → restore a
  deleted or hand-edited child; a Deployment change refreshes the owner's status;
* events of the serving pods → a container's named failure (e.g. the model download's
  `ModelDownloadFailed/NotFound: ...` termination message) becomes the owner's condition;
* startup starts the background loops: the resync (everything again every `resync_interval_s`),
  the autoscaler (autoscaling/loop.py) and, unless `--no-autotune`, the autotuner
  (autotune/loop.py), while this replica is the active one (kube/peering.py: with `--peering`,
  kopf pauses the handlers of a standby replica and the gate these loops); cleanup stops them.

No timers or delete handlers, so kopf puts no finalizer on the CRs: deletion never waits for
the operator, and the garbage collector removes the children through their owner references.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Coroutine
from typing import Any

import kopf
from pagoda.operator.kube.names import (
    ISVC,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    RESOURCES,
    WATCHED_CHILD_KINDS,
    pod_labels,
)
from pagoda.operator.kube.peering import cancel_all


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    config = memo.config

    def loops() -> dict[str, Coroutine[Any, Any, None]]:
        """The loops, made afresh each time this replica becomes the active one."""
        made = {"pagoda-resync": memo.reconciler.resync_loop(logger)}
        if memo.autoscaler is not None:
            memo.autoscaler.forget_all()  # an earlier term's is stale: read each status back
            made["pagoda-autoscale"] = memo.autoscaler.run()
        if memo.autotuner is not None:
            memo.autotuner.forget_all()  # likewise: the products' memory is read back
            made["pagoda-autotune"] = memo.autotuner.run()
        return made

    # Kopf pauses its own handlers on a standby replica (peering); the gate pauses these.
    memo.tasks = [
        asyncio.create_task(memo.gate.while_active(loops, logger), name="pagoda-loops"),
        asyncio.create_task(memo.gate.run(), name="pagoda-peering"),
    ]
    logger.info(
        "Pagoda operator started (%s, default image %s).",
        "cluster-wide" if config.clusterwide else "namespaces " + ",".join(config.namespaces),
        config.default_image,
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await cancel_all(getattr(memo, "tasks", ()))  # a loop that died is logged, not raised
    await memo.reconciler.close()
    await memo.api.close()


@kopf.index(*ISVC)
def isvc_index(
    namespace: str, name: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest body of every InferenceService, for the child-event handler."""
    return {(namespace, name): copy.deepcopy(dict(body))}


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)  # spec, labels, annotations (not status)
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
    owner = _indexed_owner(body, isvc_index)
    if owner is not None:
        await memo.reconciler.child_event(type, copy.deepcopy(dict(body)), owner, logger)


@kopf.on.event("", "v1", "pods", labels=pod_labels())
async def pod_event(
    type: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: logging.Logger,
    isvc_index: kopf.Index,
    **_: Any,
) -> None:
    """A serving pod changed: a container that failed with a named reason (its termination
    message) becomes the owner's condition (reconcile/pods.py)."""
    owner = _indexed_owner(body, isvc_index)
    await memo.reconciler.pod_event(type, copy.deepcopy(dict(body)), owner, logger)


def _indexed_owner(body: kopf.Body, isvc_index: kopf.Index) -> dict[str, Any] | None:
    """The InferenceService a child or pod names in its instance label, from `isvc_index`;
    None when it names none or that one is not indexed."""
    meta = body.get("metadata") or {}
    owner_name = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    store = isvc_index.get((meta.get("namespace"), owner_name)) if owner_name else None
    return next(iter(store), None) if store else None


for _kind in WATCHED_CHILD_KINDS:
    _res = RESOURCES[_kind]
    kopf.on.event(_res.group, _res.version, _res.plural, labels={LABEL_MANAGED_BY: MANAGED_BY})(
        child_event
    )
