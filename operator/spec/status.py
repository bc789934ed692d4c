"""InferenceService status: conditions (Ready, Progressing, Degraded), replicas, selector, url.

Pure functions: `compute_status` derives the whole status from the workload (the Deployment, or
a multi-node service's LeaderWorkerSet), the spec check and the pods' named failures (a
container's termination message, spec/pod_failure.py); `status_patch` returns only what changed
(None when nothing did), so the operator writes
status on real change only. `status.autoscaling` belongs to the autoscaler and is never touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.names import leader_selector_labels, now_iso, selector_labels

if TYPE_CHECKING:
    from pagoda.operator.spec.fields import SpecError
    from pagoda.operator.spec.pod_failure import PodFailure

CONDITION_TYPES = ("Ready", "Progressing", "Degraded")
MAX_MESSAGE = 32768  # the CRD's maxLength of a condition message (longer ones are rejected)
MAX_REASON = 1024


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str

    def __post_init__(self) -> None:
        if self.type not in CONDITION_TYPES:
            raise ValueError(f"unknown condition type {self.type!r}")
        if not self.reason or not self.reason[0].isupper() or not self.reason.isalnum():
            raise ValueError(f"condition reason must be CamelCase, got {self.reason!r}")


def _deployment_condition(deployment: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return {}


def _group_size(workload: Mapping[str, Any]) -> int | None:
    """Pods per group of a LeaderWorkerSet; None for a Deployment."""
    if workload.get("kind") != "LeaderWorkerSet":
        return None
    template = (workload.get("spec") or {}).get("leaderWorkerTemplate") or {}
    return int(template.get("size") or 1)


def _conditions(
    deployment: Mapping[str, Any] | None, spec_error: SpecError | None, kind: str = "Deployment"
) -> list[Condition]:
    if deployment is None:
        if spec_error is not None:
            return [
                Condition("Ready", False, spec_error.reason, spec_error.message),
                Condition(
                    "Progressing", False, spec_error.reason, "not rolling out an invalid spec"
                ),
                Condition("Degraded", True, spec_error.reason, spec_error.message),
            ]
        return [
            Condition("Ready", False, f"{kind}Missing", f"the {kind} does not exist yet"),
            Condition("Progressing", True, "Creating", f"creating the {kind}"),
            Condition("Degraded", False, "AsExpected", ""),
        ]
    st = deployment.get("status") or {}
    desired = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    ready, updated, total = (
        int(st.get(k) or 0) for k in ("readyReplicas", "updatedReplicas", "replicas")
    )
    generation = (deployment.get("metadata") or {}).get("generation")
    observed = generation is None or int(st.get("observedGeneration") or 0) >= int(generation)
    group = _group_size(deployment)
    if group is None:
        counts = f"{ready}/{desired} replicas ready, {updated}/{desired} updated"
    else:
        counts = f"{ready}/{desired} groups of {group} pods ready, {updated}/{desired} updated"

    if desired == 0:
        ready_cond = Condition("Ready", False, "ScaledToZero", "spec.replicas is 0")
    elif ready >= 1:
        ready_cond = _serving(deployment, counts)
    else:
        ready_cond = Condition("Ready", False, "Unavailable", counts)

    if spec_error is not None:
        degraded = Condition("Degraded", True, spec_error.reason, spec_error.message)
        progressing = Condition(
            "Progressing",
            False,
            spec_error.reason,
            f"keeping the last valid {deployment.get('kind') or kind}",
        )
        return [ready_cond, progressing, degraded]
    degraded = _rollout_degraded(deployment)
    if not observed:
        controller = deployment.get("kind") or "Deployment"
        progressing = Condition(
            "Progressing", True, "RollingOut", f"waiting for the {controller} controller"
        )
    elif updated < desired or ready < desired or total > desired:
        progressing = Condition("Progressing", True, "RollingOut", counts)
    else:
        progressing = Condition("Progressing", False, "RolloutComplete", counts)
    return [ready_cond, progressing, degraded]


def _serving(workload: Mapping[str, Any], counts: str) -> Condition:
    """Ready=True: at least one replica (group) serves. A Deployment that is not `Available`
    (fewer ready than replicas - maxUnavailable: a scale-up that lets no pod down, a crashed pod)
    still serves from its ready replicas; the reason says so (`PartiallyAvailable`). A
    LeaderWorkerSet's Available means every group is ready, so it is not consulted."""
    if workload.get("kind") == "LeaderWorkerSet":
        return Condition("Ready", True, "Available", counts)
    available = _deployment_condition(workload, "Available")
    if available.get("status") == "True":
        return Condition("Ready", True, "Available", counts)
    why = available.get("message") or available.get("reason") or "no Available condition yet"
    return Condition(
        "Ready", True, "PartiallyAvailable", f"{counts}; the Deployment is not Available: {why}"
    )


def _rollout_degraded(deployment: Mapping[str, Any]) -> Condition:
    """Degraded from the Deployment controller's conditions: a stalled or failing rollout."""
    stalled = _deployment_condition(deployment, "Progressing")
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if stalled.get("status") == "False" and stalled.get("reason") == "ProgressDeadlineExceeded":
        degraded = Condition(
            "Degraded",
            True,
            "RolloutStalled",
            stalled.get("message") or "progress deadline exceeded",
        )
    elif failure.get("status") == "True":
        degraded = Condition(
            "Degraded", True, "ReplicaFailure", failure.get("message") or "pods cannot be created"
        )
    else:
        degraded = Condition("Degraded", False, "AsExpected", "")
    return degraded


def _with_pod_failure(conditions: list[Condition], failure: PodFailure) -> list[Condition]:
    """A pod's named failure (e.g. ModelDownloadFailed) becomes Degraded's reason, and Ready's
    while no replica is ready (a service that serves stays Ready)."""
    out = []
    for cond in conditions:
        if cond.type == "Degraded" or (cond.type == "Ready" and cond.reason == "Unavailable"):
            cond = Condition(
                cond.type, cond.type == "Degraded", failure.reason, failure.description
            )
        out.append(cond)
    return out


def compute_status(
    body: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
    *,
    spec_error: SpecError | None = None,
    url: str | None = None,
    kind: str = "Deployment",
    pod_failure: PodFailure | None = None,
    model: Mapping[str, Any] | EllipsisType | None = ...,
    adapters: Sequence[Mapping[str, Any]] | EllipsisType = ...,
    draft_model: Mapping[str, Any] | EllipsisType | None = ...,
) -> dict[str, Any]:
    """The full status this InferenceService should have now. `model`: the hf:// pin
    (reconcile/model_pin.py) to show as `status.model`, None to remove it, `...` (writers other
    than the full reconcile) to leave it as it is; `adapters` likewise, the LoRA adapters the
    children serve (`status.adapters`, removed when empty), `draft_model` the draft model's pin
    (`status.draftModel`, as `model`). `deployment`: the workload, a
    Deployment or a LeaderWorkerSet (`kind`, when there is none yet); for a LeaderWorkerSet the
    replicas count groups and the selector picks their leaders."""
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    old = {c.get("type"): c for c in ((body.get("status") or {}).get("conditions") or [])}
    kind = (deployment or {}).get("kind") or kind
    conditions = []
    computed = _conditions(deployment, spec_error, kind)
    if pod_failure is not None and spec_error is None and deployment is not None:
        computed = _with_pod_failure(computed, pod_failure)
    for cond in computed:
        status = "True" if cond.status else "False"
        prev = old.get(cond.type) or {}
        conditions.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason[:MAX_REASON],
                "message": cond.message[:MAX_MESSAGE],
                "lastTransitionTime": (
                    prev.get("lastTransitionTime") if prev.get("status") == status else None
                )
                or now_iso(),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    # Conditions of other writers (e.g. the autoscaler's MetricsUnavailable) are kept as they are.
    conditions += [c for t, c in old.items() if t not in CONDITION_TYPES]
    dst = (deployment or {}).get("status") or {}
    selector = leader_selector_labels if kind == "LeaderWorkerSet" else selector_labels
    status: dict[str, Any] = {
        "conditions": conditions,
        "replicas": int(dst.get("replicas") or 0),
        "readyReplicas": int(dst.get("readyReplicas") or 0),
        "updatedReplicas": int(dst.get("updatedReplicas") or 0),
        "selector": ",".join(f"{k}={v}" for k, v in selector(meta.get("name", "")).items()),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if url is not None:
        status["url"] = url
    if model is not ...:
        status["model"] = dict(model) if model is not None else None
    if adapters is not ...:
        status["adapters"] = [dict(a) for a in adapters] or None
    if draft_model is not ...:
        status["draftModel"] = dict(draft_model) if draft_model is not None else None
    return status


def status_patch(
    current: Mapping[str, Any] | None, desired: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Keys of `desired` that differ from `current` (a merge patch for /status), or None."""
    current = current or {}
    changed = {k: v for k, v in desired.items() if current.get(k) != v}
    return changed or None


def merge_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: changed keys, nested objects
    diffed, and keys `new` no longer has set to null (a merge patch keeps what it omits). `new`
    holds no nulls (a null would delete its key)."""
    old = old or {}
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        was = old.get(key)
        if isinstance(value, Mapping) and isinstance(was, Mapping):
            if (sub := merge_diff(was, value)) or key not in old:
                patch[key] = sub
        elif key not in old or was != value:
            patch[key] = value
    return patch


def condition(body: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    """A condition of an InferenceService body ({} when absent)."""
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return {}


def with_condition(
    conditions: list[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """`conditions` with `type_` set; its lastTransitionTime is kept while the status holds.

    For writers other than the reconciler (the autoscaler's MetricsUnavailable).
    """
    value = "True" if status else "False"
    out: list[dict[str, Any]] = []
    prev: Mapping[str, Any] = {}
    for cond in conditions or []:
        if cond.get("type") == type_:
            prev = cond
        else:
            out.append(dict(cond))
    new = {
        "type": type_,
        "status": value,
        "reason": reason[:MAX_REASON],
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": (
            prev.get("lastTransitionTime") if prev.get("status") == value else None
        )
        or now_iso(),
    }
    if generation is not None:
        new["observedGeneration"] = generation
    return [*out, new]


def without_condition(
    conditions: list[Mapping[str, Any]] | None, type_: str
) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions or [] if c.get("type") != type_]
