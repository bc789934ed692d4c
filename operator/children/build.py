"""Everything one InferenceService needs: its children in apply order, and those that must not
exist. Pure: the reconciler applies what this returns.

Every child is adopted by its owner (children/owner.py) and carries the standard
`app.kubernetes.io/*` labels; selector labels are a fixed subset that never includes user
labels, so they stay immutable for the Deployment's lifetime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling import rules
from pagoda.operator.autotune.mount import mount_profile
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.deployment import build_deployment
from pagoda.operator.children.monitoring import build_prometheus_rule, build_service_monitor
from pagoda.operator.children.pdb import build_pdb, wants_pdb
from pagoda.operator.children.service import build_service

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


def build_children(
    owner: Owner,
    spec: InferenceServiceSpec,
    *,
    current_replicas: int | None = None,
    service_monitor: bool = False,
    prometheus_rule: bool = False,
    tuned: TunedMount | None = None,
) -> Children:
    """Everything one InferenceService needs, in apply order (ConfigMap before the Deployment).

    `service_monitor` / `prometheus_rule` say whether those monitoring.coreos.com kinds exist;
    without them there is nothing to build or delete. The PrometheusRule exists only with
    `spec.autoscaling` (its alerts ask the autoscaler for a step). `tuned`: the tuned profile the
    pods mount (autotune/mount.py), None for the runtime's defaults.
    """
    cm = build_config_map(owner, spec)
    deployment = build_deployment(
        owner, spec, config_hash_value=config_hash(cm), current_replicas=current_replicas
    )
    if tuned is not None:
        mount_profile(deployment, tuned)
    desired = [cm, deployment, build_service(owner)]
    absent: list[tuple[str, str]] = []
    if wants_pdb(spec):
        desired.append(build_pdb(owner))
    else:
        absent.append(("PodDisruptionBudget", owner.name))
    if service_monitor:
        desired.append(build_service_monitor(owner))
    if prometheus_rule and spec.autoscaling is not None:
        desired.append(build_prometheus_rule(owner, spec))
    elif prometheus_rule:
        absent.append(("PrometheusRule", rules.rule_name(owner.name)))
    return Children(desired=tuple(desired), absent=tuple(absent))
