"""Everything one InferenceService needs: its children in apply order, and those that must not
exist. Pure: the reconciler applies what this returns.

Every child is adopted by its owner (children/owner.py) and carries the standard
`app.kubernetes.io/*` labels; selector labels are a fixed subset that never includes user
labels, so they stay immutable for the Deployment's lifetime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling import rules
from pagoda.operator.autotune.mount import mount_profile
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.deployment import (
    build_deployment,
    pin_to_one_node,
    pod_template,
    rolling_update,
)
from pagoda.operator.children.leaderworkerset import build_leader_worker_set
from pagoda.operator.children.monitoring import build_prometheus_rule, build_service_monitor
from pagoda.operator.children.pdb import build_pdb, wants_pdb
from pagoda.operator.children.service import build_service
from pagoda.operator.kube.names import lws_name

if TYPE_CHECKING:
    from pagoda.operator.autotune.mount import TunedMount
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec


@dataclass(frozen=True)
class Children:
    """What should exist (`desired`) and what must not (`absent`: (kind, name) pairs)."""

    desired: tuple[dict[str, Any], ...]
    absent: tuple[tuple[str, str], ...]

    def get(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.desired if c["kind"] == kind)

    @property
    def workload(self) -> dict[str, Any]:
        """The Deployment, or the LeaderWorkerSet of a multi-node service."""
        return next(c for c in self.desired if c["kind"] in ("Deployment", "LeaderWorkerSet"))


def build_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    *,
    current_replicas: int | None = None,
    current_kind: str | None = None,
    service_monitor: bool = False,
    prometheus_rule: bool = False,
    own_service_monitor: bool = True,
    own_prometheus_rule: bool = True,
    monitoring_labels: Sequence[tuple[str, str]] = (),
    tuned: TunedMount | None = None,
    one_node: bool = False,
) -> Children:
    """Everything one InferenceService needs, in apply order (ConfigMap before the workload: a
    Deployment, or a LeaderWorkerSet with `spec.parallelism.nodes` > 1).

    `current_replicas`: the live workload's, of `current_kind` (None: the kind built here); a
    workload of the other kind is being replaced, and its replicas carry over
    (`InferenceServiceSpec.desired_replicas`).
    `service_monitor` / `prometheus_rule` say whether those monitoring.coreos.com kinds exist;
    without them there is nothing to build or delete. The PrometheusRule exists only with
    `spec.autoscaling` (its alerts ask the autoscaler for a step). `own_service_monitor` /
    `own_prometheus_rule` False (`--no-service-monitors` / `--no-prometheus-rules`): another
    object (the chart's) owns that concern, so the operator's own are deleted, never built; one
    scrape per pod and one rule per alert. The PrometheusRule then keeps only the service's TTFT
    alert threshold (a recording rule the chart's PagodaTTFTHigh compares with; none without
    targetTTFTSeconds). `monitoring_labels` (`--monitoring-label`): extra
    labels on both, e.g. `release` for kube-prometheus-stack's selectors. `tuned`: the tuned profile the
    pods mount (autotune/mount.py), None for the runtime's defaults. `one_node`: the pods must
    share one node (a ReadWriteOnce claim several of them mount: validation.check_cluster).
    """
    cm = build_config_map(owner, spec)
    workload, other_kind = _workload(owner, spec, cm, current_replicas, current_kind, tuned)
    if one_node and not spec.multi_node:  # validation refuses a group on a single-node claim
        pin_to_one_node(workload, owner)
    absent: list[tuple[str, str]] = [other_kind]
    desired = [cm, workload, build_service(owner, leaders_only=spec.multi_node)]
    if wants_pdb(spec):
        desired.append(build_pdb(owner))
    else:
        absent.append(("PodDisruptionBudget", owner.name))
    if service_monitor and own_service_monitor:
        desired.append(build_service_monitor(owner, monitoring_labels))
    elif service_monitor:
        absent.append(("ServiceMonitor", owner.name))
    if prometheus_rule:
        rule = None
        if spec.autoscaling is not None:
            rule = build_prometheus_rule(owner, spec, monitoring_labels, alerts=own_prometheus_rule)
        if rule is not None:
            desired.append(rule)
        else:
            absent.append(("PrometheusRule", rules.rule_name(owner.name)))
    return Children(desired=tuple(desired), absent=tuple(absent))


def _workload(
    owner: Owner,
    spec: InferenceServiceSpec,
    cm: dict[str, Any],
    current_replicas: int | None,
    current_kind: str | None,
    tuned: TunedMount | None,
) -> tuple[dict[str, Any], tuple[str, str]]:
    """The Deployment or, multi-node, the LeaderWorkerSet, and the (kind, name) of the other one,
    which must not exist: switching kinds deletes it."""
    replacing = current_kind is not None and current_kind != spec.workload_kind
    if spec.multi_node:
        workload = build_leader_worker_set(
            owner,
            spec,
            pod_template=pod_template(owner, spec, config_hash_value=config_hash(cm)),
            rolling_update=rolling_update(spec),
            current_replicas=current_replicas,
            replacing=replacing,
        )
        return workload, ("Deployment", owner.name)
    workload = build_deployment(
        owner,
        spec,
        config_hash_value=config_hash(cm),
        current_replicas=current_replicas,
        replacing=replacing,
    )
    if tuned is not None:  # tuning is for one-GPU servers only (the spec refuses the rest)
        mount_profile(workload, tuned)
    return workload, ("LeaderWorkerSet", lws_name(owner.name))
