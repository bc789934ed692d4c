"""The Deployment: one `server` container running `pagoda serve`, its probes, resources, volumes
and restricted security context (+ the `model-download` init container of an hf:// or s3://
model, the `adapter-download` one of hf:// or s3:// LoRA adapters, the `draft-download` one of an
hf:// or s3:// draft model: children/model_cache.py).
Pure.

`replicas` is left out once the autoscaler owns it (see
`InferenceServiceSpec.desired_replicas`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pagoda.operator.children.model_cache import (
    add_adapter_download,
    add_draft_download,
    add_model_download,
)
from pagoda.operator.children.owner import adopt, child
from pagoda.operator.children.serve_args import server_args
from pagoda.operator.kube.names import (
    CONFIG_HASH_ANNOTATION,
    GPU_RESOURCE,
    SERVER_PORT,
    cache_env,
    config_map_name,
    container_security,
    pod_security,
    selector_labels,
    standard_labels,
)
from pagoda.runtime import options

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec
    from pagoda.operator.spec.model_ref import ModelRef

CONTAINER_NAME = "server"
CONFIG_MOUNT = "/etc/pagoda"
PRESTOP_SLEEP_S = 5  # lets endpoints drop the pod before SIGTERM starts the drain
PROBE_PERIOD_S = 10


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    r = spec.resources
    requests: dict[str, Any] = {"cpu": r.cpu, "memory": r.memory}
    limits: dict[str, Any] = {"memory": r.memory_limit or r.memory}
    if r.cpu_limit:
        limits["cpu"] = r.cpu_limit
    if r.gpus:
        requests[GPU_RESOURCE] = str(r.gpus)
        limits[GPU_RESOURCE] = str(r.gpus)
    return {"requests": requests, "limits": limits}


def _env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    user = [dict(e) for e in spec.env]
    names = {e["name"] for e in user}
    env = [e for e in cache_env() if e["name"] not in names] + user
    if spec.api_key_secret is not None:
        ref = spec.api_key_secret
        env.append(
            {
                "name": options.API_KEY_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    return env


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _volumes(owner: Owner, model: ModelRef) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(owner.name)}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    model.add_volume(volumes, mounts)
    return volumes, mounts


def termination_grace_seconds(spec: InferenceServiceSpec) -> int:
    """preStop sleep + the server's drain timeout + a margin for the process to exit."""
    return PRESTOP_SLEEP_S + spec.drain_timeout_seconds + 10


def _container(spec: InferenceServiceSpec, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The `server` container: `pagoda serve`, probes, resources, restricted security context."""
    startup_failures = max(1, math.ceil(spec.startup_timeout_seconds / PROBE_PERIOD_S))
    return {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["pagoda", "serve"],
        "args": server_args(spec),
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "startupProbe": _probe(options.HEALTH_PATH, PROBE_PERIOD_S, 5, startup_failures),
        "livenessProbe": _probe(options.HEALTH_PATH, PROBE_PERIOD_S, 5, 3),
        "readinessProbe": _probe(options.READY_PATH, 5, 3, 3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
        "securityContext": container_security(),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _pod_spec(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    volumes, mounts = _volumes(owner, spec.model)
    tolerations = [dict(t) for t in spec.tolerations]
    if spec.resources.gpus and not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(spec.pod_ids),
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "containers": [_container(spec, mounts)],
        "volumes": volumes,
    }
    add_model_download(pod_spec, spec, readers=(CONTAINER_NAME,))  # hf://, s3:// only
    add_adapter_download(pod_spec, spec, readers=(CONTAINER_NAME,))  # hf://, s3:// adapters
    add_draft_download(pod_spec, spec, readers=(CONTAINER_NAME,))  # an hf://, s3:// draft model
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return pod_spec


def rolling_update(spec: InferenceServiceSpec) -> dict[str, int]:
    """GPUs are scarce: roll one replica down before the next comes up instead of surging."""
    if spec.resources.gpus:
        return {"maxSurge": 0, "maxUnavailable": 1}
    return {"maxSurge": 1, "maxUnavailable": 0}


def progress_deadline_seconds(spec: InferenceServiceSpec) -> int:
    """How long a new pod may take to become ready before the Deployment controller reports the
    rollout stalled (ProgressDeadlineExceeded, shown as Degraded=RolloutStalled): the startup
    probe's budget, the model download's (hf://, s3://: the init container runs before it) and a
    margin for scheduling and the image pull."""
    download = spec.model_cache.download_deadline if spec.downloads else 0
    return spec.startup_timeout_seconds + download + 300


def build_deployment(
    owner: Owner,
    spec: InferenceServiceSpec,
    *,
    config_hash_value: str,
    current_replicas: int | None = None,
    replacing: bool = False,
) -> dict[str, Any]:
    """The Deployment. `replicas` is left out once the autoscaler owns it (one field, one writer:
    see `InferenceServiceSpec.desired_replicas`), so applying this never rewrites its choice.
    `replacing`: `current_replicas` are a LeaderWorkerSet's that this Deployment replaces."""
    obj = child(owner, "Deployment", "apps/v1", owner.name)
    rolling = rolling_update(spec)
    replicas = spec.desired_replicas(current_replicas, replacing=replacing)
    obj["spec"] = {
        **({"replicas": replicas} if replicas is not None else {}),
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": progress_deadline_seconds(spec),
        "selector": {"matchLabels": selector_labels(owner.name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
        "template": pod_template(owner, spec, config_hash_value=config_hash_value),
    }
    return adopt(obj, owner)


def pod_template(
    owner: Owner, spec: InferenceServiceSpec, *, config_hash_value: str
) -> dict[str, Any]:
    """The pod template of the server: the Deployment's, and a LeaderWorkerSet group's leader's
    (children/leaderworkerset.py derives its workers' from it), so both run the same pod."""
    return {
        "metadata": {
            "labels": standard_labels(owner.name),
            "annotations": {
                CONFIG_HASH_ANNOTATION: config_hash_value,
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(SERVER_PORT),
                "prometheus.io/path": options.METRICS_PATH,
                "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
            },
        },
        "spec": _pod_spec(owner, spec),
    }


def pin_to_one_node(deployment: dict[str, Any], owner: Owner) -> None:
    """Make every pod of this Deployment (a rollout's new ones too) share one node, the one its
    first pod lands on: required pod affinity to its own pods by hostname (the scheduler admits
    the first pod of a self-affine set anywhere). For a ReadWriteOnce claim that several pods
    mount: a pod on a second node would hang in ContainerCreating (Multi-Attach error); pinned,
    one that does not fit stays Pending with the scheduler's reason instead."""
    term = {
        "labelSelector": {"matchLabels": selector_labels(owner.name)},
        "topologyKey": "kubernetes.io/hostname",
    }
    pod_spec = deployment["spec"]["template"]["spec"]
    pod_spec["affinity"] = {
        "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    }
