"""Pure builders: an InferenceService (parsed spec + owner identity) → child manifests as dicts.

No I/O here. Every child is adopted by its owner (`kopf.adopt`: owner reference, namespace,
owner labels) and carries the standard `app.kubernetes.io/*` labels; selector labels are a fixed
subset that never includes user labels, so they stay immutable for the Deployment's lifetime.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.autoscaling import rules
from pagoda.operator.autotune.mount import TunedMount, mount_profile
from pagoda.operator.config import SERVER_PORT
from pagoda.operator.model_ref import ModelRef
from pagoda.operator.names import (
    API_VERSION,
    CONFIG_HASH_ANNOTATION,
    GPU_RESOURCE,
    KIND,
    LABEL_INSTANCE,
    cache_env,
    config_map_name,
    container_security,
    selector_labels,
    standard_labels,
)
from pagoda.operator.serve_args import engine_config, server_args
from pagoda.operator.spec import InferenceServiceSpec
from pagoda.runtime import options

CONTAINER_NAME = "server"
CONFIG_MOUNT = "/etc/pagoda"
PRESTOP_SLEEP_S = 5  # lets endpoints drop the pod before SIGTERM starts the drain
PROBE_PERIOD_S = 10
RUN_AS_ID = 1000


@dataclass(frozen=True)
class Owner:
    """Identity of the InferenceService that owns the children."""

    name: str
    namespace: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        meta = body.get("metadata") or {}
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            labels=tuple(sorted((meta.get("labels") or {}).items())),
        )

    def reference(self) -> dict[str, Any]:
        """The controller owner reference every child carries (garbage collection, adoption)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class Children:
    """What should exist (`desired`) and what must not (`absent`: (kind, name) pairs)."""

    desired: tuple[dict[str, Any], ...]
    absent: tuple[tuple[str, str], ...]

    def get(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.desired if c["kind"] == kind)


def _meta(owner: Owner, kind: str, api_version: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": standard_labels(owner.name),
        },
    }


def _adopt(obj: dict[str, Any], owner: Owner) -> dict[str, Any]:
    """What `kopf.adopt` does (controller owner reference, the owner's labels where not set),
    without importing kopf, so the builders stay importable without aiohttp."""
    meta = obj["metadata"]
    meta["ownerReferences"] = [owner.reference()]
    for key, value in owner.labels:
        meta["labels"].setdefault(key, value)
    return obj


def build_config_map(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    obj = _meta(owner, "ConfigMap", "v1", config_map_name(owner.name))
    cfg = engine_config(spec)
    obj["data"] = {
        "engine.json": json.dumps(cfg, indent=2, sort_keys=True) + "\n",
        "serve-args": shlex.join(["pagoda", "serve", *cfg["args"]]) + "\n",
    }
    return _adopt(obj, owner)


def config_hash(config_map: Mapping[str, Any]) -> str:
    """A short stable hash of a ConfigMap's data; put in the pod template to roll on change."""
    raw = json.dumps(config_map.get("data") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


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
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "containers": [_container(spec, mounts)],
        "volumes": volumes,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return pod_spec


def build_deployment(
    owner: Owner,
    spec: InferenceServiceSpec,
    *,
    config_hash_value: str,
    current_replicas: int | None = None,
) -> dict[str, Any]:
    """The Deployment. `replicas` is left out once the autoscaler owns it (one field, one writer:
    see `InferenceServiceSpec.desired_replicas`), so applying this never rewrites its choice."""
    obj = _meta(owner, "Deployment", "apps/v1", owner.name)
    # GPUs are scarce: roll one replica down before the next comes up instead of surging.
    rolling = (
        {"maxSurge": 0, "maxUnavailable": 1}
        if spec.resources.gpus
        else {"maxSurge": 1, "maxUnavailable": 0}
    )
    replicas = spec.desired_replicas(current_replicas)
    obj["spec"] = {
        **({"replicas": replicas} if replicas is not None else {}),
        "revisionHistoryLimit": 5,
        "progressDeadlineSeconds": spec.startup_timeout_seconds + 300,
        "selector": {"matchLabels": selector_labels(owner.name)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
        "template": {
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
        },
    }
    return _adopt(obj, owner)


def build_service(owner: Owner) -> dict[str, Any]:
    obj = _meta(owner, "Service", "v1", owner.name)
    obj["spec"] = {
        "type": "ClusterIP",
        "selector": selector_labels(owner.name),
        "ports": [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    return _adopt(obj, owner)


def build_pdb(owner: Owner) -> dict[str, Any]:
    obj = _meta(owner, "PodDisruptionBudget", "policy/v1", owner.name)
    obj["spec"] = {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}}
    return _adopt(obj, owner)


def _prom_name(label: str) -> str:
    """A Kubernetes label as Prometheus' service discovery names it (non-alphanumerics → _)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def _relabel(source: str, target: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [source], "targetLabel": target}


def build_service_monitor(owner: Owner) -> dict[str, Any]:
    obj = _meta(owner, "ServiceMonitor", "monitoring.coreos.com/v1", owner.name)
    obj["spec"] = {
        "selector": {"matchLabels": selector_labels(owner.name)},
        "endpoints": [
            {
                "port": "http",
                "path": options.METRICS_PATH,
                "interval": "15s",
                # the same target labels as the chart's runtime ServiceMonitor (alerts group by them)
                "relabelings": [
                    _relabel("__meta_kubernetes_namespace", "namespace"),
                    _relabel(
                        f"__meta_kubernetes_pod_label_{_prom_name(LABEL_INSTANCE)}",
                        "inferenceservice",
                    ),
                    _relabel("__meta_kubernetes_pod_name", "pod"),
                ],
            }
        ],
    }
    return _adopt(obj, owner)


def build_prometheus_rule(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """This service's alerts (rules.py), so Alertmanager can ask POST /alerts for a step."""
    obj = _meta(owner, "PrometheusRule", "monitoring.coreos.com/v1", rules.rule_name(owner.name))
    obj["spec"] = rules.service_rules(owner.namespace, owner.name, spec)
    return _adopt(obj, owner)


def wants_pdb(spec: InferenceServiceSpec) -> bool:
    """A PDB only makes sense for a service meant to run more than one replica."""
    return (spec.autoscaling.max_replicas if spec.autoscaling else spec.replicas) > 1


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
