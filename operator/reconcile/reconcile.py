"""Reconciliation: make the children match the spec, then make the status match the children.

Level-based and idempotent: every path (create/update/resume handlers, child watch events, the
periodic resync, the autotuner) converges on the same state and writes only on real change
(children through apply.py). Kopf-specific error mapping lives in retry.py; here API failures
surface as `ApiError` and spec problems as `SpecError`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from pagoda.operator.autotune import mount as autotune_mount
from pagoda.operator.children.build import build_children
from pagoda.operator.children.owner import Owner
from pagoda.operator.kube.client import MERGE_PATCH, ApiError, KubeApi
from pagoda.operator.kube.locks import object_lock
from pagoda.operator.kube.names import KIND, RESOURCES, WORKLOAD_KINDS, owned_by, workload_name
from pagoda.operator.reconcile import model_pin
from pagoda.operator.reconcile.apply import UNKNOWN, apply_child, delete_child
from pagoda.operator.spec import status, validation
from pagoda.operator.spec.fields import SpecError

if TYPE_CHECKING:
    from pagoda.operator.reconcile.pods import PodFailures
    from pagoda.operator.spec.config import OperatorConfig

log = logging.getLogger(__name__)
# Degraded reasons only a full reconcile may clear (child events keep them as they are).
STICKY_REASONS = validation.SPEC_REASONS | {"ResourceConflict", model_pin.REASON}


@dataclass(frozen=True)
class Result:
    spec_error: SpecError | None
    status_changed: bool


class StatusWriteError(ApiError):
    """The status write failed. Told apart from other API errors: a refusal (`refused`: a 4xx
    such as a 422 from a CRD older than the operator, or a 403), whatever its code, is retried
    with backoff and posted as an Event (reconcile/retry.py), since the user sees nothing while
    status cannot be written; an outage or a conflict is retried as any transient error."""

    @property
    def refused(self) -> bool:
        return 400 <= self.status < 500 and self.status not in (404, 408, 409, 429)


async def live_workload(api: KubeApi, owner: Owner) -> dict[str, Any] | None:
    """The Deployment or LeaderWorkerSet this InferenceService controls now (either kind: the
    spec may have just switched), with `kind` filled in."""
    for kind in WORKLOAD_KINDS:
        if kind != "Deployment" and not await api.has_resource(kind):
            continue
        obj = await api.get(kind, owner.namespace, workload_name(kind, owner.name))
        if owned_by(obj, owner.uid):
            assert obj is not None
            obj.setdefault("kind", kind)
            return obj
    return None


async def write_status(
    api: KubeApi,
    body: Mapping[str, Any],
    workload: Mapping[str, Any] | None,
    *,
    spec_error: SpecError | None,
    url: str | None,
    fresh: Mapping[str, Any] | None = None,
    kind: str = "Deployment",
    pods: PodFailures | None = None,
    model: Mapping[str, Any] | EllipsisType | None = ...,
    adapters: list[dict[str, Any]] | EllipsisType = ...,
    draft_model: Mapping[str, Any] | EllipsisType | None = ...,
) -> bool:
    """Patch /status with what changed, against a fresh read of the object. True if it wrote.

    `workload`: the Deployment or LeaderWorkerSet (`kind`: the one wanted, when it is missing).
    `model`: the hf:// pin for `status.model` (the full reconcile's; `...` leaves it), `adapters`
    the LoRA adapters for `status.adapters`, `draft_model` the draft model's pin for
    `status.draftModel` (likewise).
    `fresh` may be passed when the caller read the object under the same per-object lock
    (only code holding that lock writes status, so it cannot be stale). A refused write raises
    `StatusWriteError`.
    """
    meta = body["metadata"]
    if fresh is None:
        fresh = await api.get(KIND, meta["namespace"], meta["name"])
    if fresh is None or fresh["metadata"].get("uid") != meta.get("uid"):
        return False  # deleted (or replaced) meanwhile
    # Stamp the generation that was reconciled, not a newer one that arrived in between.
    target = {**fresh, "metadata": {**fresh["metadata"], "generation": meta.get("generation")}}
    failure = pods.failure(meta["namespace"], meta["name"]) if pods is not None else None
    new = status.compute_status(
        target, workload, spec_error=spec_error, url=url, kind=kind, pod_failure=failure,
        model=model, adapters=adapters, draft_model=draft_model,
    )  # fmt: skip
    patch = status.status_patch(fresh.get("status"), new)
    if patch is None:
        return False
    try:
        await api.patch(
            KIND, meta["namespace"], meta["name"], {"status": patch}, subresource="status"
        )
    except ApiError as e:
        if e.status == 422:
            await _report_refusal(api, fresh, e)
        raise StatusWriteError(e.status, e.reason, e.message) from e
    return True


async def _report_refusal(api: KubeApi, fresh: Mapping[str, Any], error: ApiError) -> None:
    """A 422 refuses the status's content (say, a CRD older than the operator that lacks a new
    field): put the refusal in the part every version of the schema has, a `Degraded` condition,
    so `kubectl get/describe` shows why nothing else changes. Best effort; the next full write
    that succeeds replaces it (the failure still counts for /readyz until then)."""
    meta = fresh["metadata"]
    conditions = status.with_condition(
        (fresh.get("status") or {}).get("conditions"), "Degraded", True, "StatusRejected",
        f"the API server refused this object's status (HTTP {error.status} {error.reason}): "
        f"{error.message}; retrying with backoff (is the CRD older than the operator?)",
        meta.get("generation"),
    )  # fmt: skip
    path = RESOURCES[KIND].path(meta["namespace"], meta["name"], "status")
    try:  # not api.patch: this write succeeding does not mean the status can be written
        await api.request(
            "PATCH", path, body={"status": {"conditions": conditions}}, content_type=MERGE_PATCH
        )
    except ApiError as e:
        log.warning("Could not report the refused status write of %s either: %s", meta["name"], e)


async def reconcile(
    api: KubeApi,
    body: Mapping[str, Any],
    config: OperatorConfig,
    logger: logging.Logger,
    pods: PodFailures | None = None,
) -> Result:
    """Full reconcile of one InferenceService: validate, apply children, delete stale ones, status.

    `body` only locates the object: it is read again under its lock, so a handler holding an
    older body (kopf hands out the one of the event it is processing) never writes old children.
    """
    owner = Owner.from_body(body)
    async with object_lock(owner.uid):
        fresh = await api.get(KIND, owner.namespace, owner.name)
        meta = (fresh or {}).get("metadata") or {}
        if fresh is None or meta.get("uid") != owner.uid or meta.get("deletionTimestamp"):
            api.forget_status(owner.namespace, owner.name)  # its refused writes no longer matter
            return Result(spec_error=None, status_changed=False)  # gone, or going
        fresh.setdefault("apiVersion", body.get("apiVersion"))
        fresh.setdefault("kind", body.get("kind"))
        owner = Owner.from_body(fresh)
        if pods is not None and (fresh.get("status") or {}).get("observedGeneration") != meta.get(
            "generation"
        ):  # a new spec: what deleted group pods died of no longer describes it
            pods.forget_departed(owner.namespace, owner.name)
        current = await live_workload(api, owner)
        try:
            workload, model, adapters, draft = await _apply_all(
                api, fresh, owner, current, config, logger
            )
        except SpecError as e:
            changed = await write_status(api, fresh, current, spec_error=e, url=None, fresh=fresh)
            return Result(spec_error=e, status_changed=changed)
        url = config.service_url(owner.name, owner.namespace)
        changed = await write_status(
            api, fresh, workload, spec_error=None, url=url, fresh=fresh, pods=pods, model=model,
            adapters=adapters, draft_model=draft,
        )  # fmt: skip
        return Result(spec_error=None, status_changed=changed)


async def _apply_all(
    api: KubeApi,
    body: Mapping[str, Any],
    owner: Owner,
    current: Mapping[str, Any] | None,
    config: OperatorConfig,
    logger: logging.Logger,
) -> tuple[
    dict[str, Any], Mapping[str, Any] | None, list[dict[str, Any]], Mapping[str, Any] | None
]:
    """Validate, pin hf:// branches to commits (model_pin.py), then create/patch every child
    and delete the ones that must not exist; returns the live workload, the model's pin and the
    LoRA adapters served (spec.adapters, with their pins) and the draft model's pin. `current`:
    the workload of either kind (its replicas carry over a switch between a Deployment and a
    LeaderWorkerSet, so the autoscaler's choice survives it)."""
    spec = validation.parse(body, config)
    one_node = await validation.check_cluster(api, spec, owner.namespace, logger)
    spec, pin, adapter_pins, draft_pin = await model_pin.pin(api, body, spec, config, logger)
    replicas = ((current or {}).get("spec") or {}).get("replicas")
    children = build_children(
        owner,
        spec,
        current_replicas=replicas,
        current_kind=(current or {}).get("kind"),
        service_monitor=await api.has_resource("ServiceMonitor"),
        prometheus_rule=await api.has_resource("PrometheusRule"),
        own_service_monitor=config.service_monitors,
        own_prometheus_rule=config.prometheus_rules,
        monitoring_labels=config.monitoring_labels,
        tuned=await autotune_mount.lookup(api, body, spec),
        one_node=one_node is not None,
    )
    if one_node is not None and not _pinned(current):
        await _report_pin(api, body, one_node, config, logger)
    live: dict[str, dict[str, Any]] = {}
    for child in children.desired:
        actual = current if child["kind"] == (current or {}).get("kind") else UNKNOWN
        try:
            live[child["kind"]] = await apply_child(api, child, owner.uid, logger, actual=actual)
        except ApiError as e:
            if e.transient:
                raise  # retried with backoff
            raise SpecError(
                "ChildRejected",
                f"the API server rejected the {child['kind']} (HTTP {e.status} {e.reason}): "
                f"{e.message}",
            ) from e
    for kind, name in children.absent:  # after the new workload: a switch replaces, not stops
        await delete_child(api, kind, owner.namespace, name, owner.uid, logger)
    workload = live[spec.workload_kind]
    workload.setdefault("kind", spec.workload_kind)
    return workload, pin, model_pin.served_adapters(spec, adapter_pins), draft_pin


def _pinned(workload: Mapping[str, Any] | None) -> bool:
    """Whether the live workload's pods already have the one-node affinity."""
    pod_spec = (((workload or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    return "podAffinity" in (pod_spec.get("affinity") or {})


async def _report_pin(
    api: KubeApi,
    body: Mapping[str, Any],
    why: str,
    config: OperatorConfig,
    logger: logging.Logger,
) -> None:
    """Say once (when the affinity is added) that the pods now share one node, and why."""
    message = (
        f"{why}: its volume attaches to one node at a time, so every pod is scheduled onto "
        "the node of the first (required pod affinity by kubernetes.io/hostname); pods that do "
        "not fit there stay Pending. Use a ReadWriteMany claim to spread them over nodes."
    )
    logger.info("%s", message)
    await api.try_post_event(
        body, type_="Normal", reason="PinnedToOneNode", message=message,
        component=config.component_name,
    )  # fmt: skip


def spec_error_in_status(body: Mapping[str, Any]) -> SpecError | None:
    """The spec (or name-conflict) problem recorded for the current generation, if any."""
    cond = status.condition(body, "Degraded")
    generation = (body.get("metadata") or {}).get("generation")
    recorded = cond.get("status") == "True" and cond.get("reason") in STICKY_REASONS
    if recorded and cond.get("observedGeneration") == generation:
        return SpecError(cond["reason"], cond.get("message") or "")
    return None


async def on_child_event(
    api: KubeApi,
    event_type: str | None,
    child: Mapping[str, Any],
    owner_body: Mapping[str, Any],
    config: OperatorConfig,
    logger: logging.Logger,
    pods: PodFailures | None = None,
) -> None:
    """A child changed or vanished: restore it if needed; a workload change refreshes status.

    `owner_body` (from kopf's index) only locates the owner; decisions use a fresh read taken
    under the owner's lock, so a lagging index cannot resurrect an old condition.
    """
    owner = Owner.from_body(owner_body)
    kind, name = child["kind"], child["metadata"]["name"]
    if not owned_by(child, owner.uid):
        return  # labelled like ours but controlled by something else (or an older owner)
    async with object_lock(owner.uid):
        fresh = await api.get(KIND, owner.namespace, owner.name)
        meta = (fresh or {}).get("metadata") or {}
        if fresh is None or meta.get("uid") != owner.uid or meta.get("deletionTimestamp"):
            return  # the owner is going away too: the garbage collector is at work
        recorded = spec_error_in_status(fresh)
        if recorded is not None:  # keep the last valid children alone until the spec is fixed
            if kind in WORKLOAD_KINDS and event_type != "DELETED":
                workload = await api.get(kind, owner.namespace, name)  # not the event's copy
                await write_status(
                    api, fresh, workload, spec_error=recorded, url=None, fresh=fresh, kind=kind
                )
            return
        if (fresh.get("status") or {}).get("observedGeneration") != meta.get("generation"):
            return  # a spec change not reconciled yet: its handler applies every child in order
        await _restore(api, fresh, owner, kind, name, config, logger, pods)


async def on_pods_changed(
    api: KubeApi, owner_body: Mapping[str, Any], config: OperatorConfig, pods: PodFailures
) -> Mapping[str, Any] | None:
    """The owner's pods' named failure changed: write the status again (under the owner's lock,
    from a fresh read, like a workload's event). Returns the owner as read (None: gone)."""
    owner = Owner.from_body(owner_body)
    async with object_lock(owner.uid):
        fresh = await api.get(KIND, owner.namespace, owner.name)
        meta = (fresh or {}).get("metadata") or {}
        if fresh is None or meta.get("uid") != owner.uid or meta.get("deletionTimestamp"):
            return None
        fresh.setdefault("apiVersion", owner_body.get("apiVersion"))
        fresh.setdefault("kind", owner_body.get("kind", KIND))
        if (fresh.get("status") or {}).get("observedGeneration") != meta.get("generation"):
            return fresh  # a spec change not reconciled yet: its reconcile reads the registry
        workload = await live_workload(api, owner)
        recorded = spec_error_in_status(fresh)
        url = None if recorded else config.service_url(owner.name, owner.namespace)
        await write_status(
            api, fresh, workload, spec_error=recorded, url=url, fresh=fresh, pods=pods
        )
        return fresh


async def _restore(
    api: KubeApi,
    fresh: Mapping[str, Any],
    owner: Owner,
    kind: str,
    name: str,
    config: OperatorConfig,
    logger: logging.Logger,
    pods: PodFailures | None = None,
) -> None:
    """Make one child match the spec again (the owner's lock held); the workload (Deployment or
    LeaderWorkerSet) also refreshes the owner's status."""
    try:
        spec = validation.parse(fresh, config)
    except SpecError:
        return  # the create/update handler reports it
    with_pin = model_pin.recorded_spec(fresh, spec, config)
    if with_pin is None:
        return  # not pinned yet (or to be pinned again): the full reconcile does it
    spec = with_pin
    # the event's body may be older than the object (kopf batches events): read it again,
    # so neither the restore nor the status is computed from a stale version
    actual = await api.get(kind, owner.namespace, name)
    workload = kind in WORKLOAD_KINDS
    replicas = ((actual or {}).get("spec") or {}).get("replicas") if workload else None
    tuned = await autotune_mount.lookup(api, fresh, spec) if kind == "Deployment" else None
    # whether the pods must share one node is the full reconcile's call (check_cluster reads the
    # claims); a restore keeps the live Deployment's pin as it is, neither adds nor drops it, and
    # a deleted one comes back pinned if the full reconcile would pin it (not spread over nodes
    # a ReadWriteOnce claim cannot follow until the next resync)
    one_node = kind == "Deployment" and _pinned(actual)
    if kind == "Deployment" and actual is None and not spec.multi_node:
        try:
            one_node = (
                await validation.check_cluster(api, spec, owner.namespace, logger) is not None
            )
        except SpecError:
            return  # the cluster cannot run it as written: the full reconcile reports it
    children = build_children(
        owner, spec, current_replicas=replicas, service_monitor=False, tuned=tuned,
        one_node=one_node,
    )  # fmt: skip
    if (kind, name) in children.absent:
        if actual is not None:
            await delete_child(api, kind, owner.namespace, name, owner.uid, logger)
        return
    desired = next(
        (c for c in children.desired if c["kind"] == kind and c["metadata"]["name"] == name),
        None,
    )
    if desired is None:
        return
    if actual is None:
        logger.info("%s %s was deleted; restoring it.", kind, name)
    live = await apply_child(api, desired, owner.uid, logger, actual=actual)
    if workload:
        live.setdefault("kind", kind)
        url = config.service_url(owner.name, owner.namespace)
        await write_status(api, fresh, live, spec_error=None, url=url, fresh=fresh, pods=pods)
