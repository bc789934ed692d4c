"""The tuning Job of one key, and the least-privilege RBAC that lets it hand back its result. Pure.

The Job has two steps in one pod: an init container runs `pagoda tune` into an emptyDir (one
GPU, pinned to the key's GPU product, the model volume, no API credentials at all), then the
`publish` container runs `pagoda publish-profile`, the only one that gets a service-account
token (a projected volume mounted into it alone). That ServiceAccount's Role allows `get` and
`patch` on exactly one ConfigMap (`resourceNames`), the one the operator pre-created for this
key. Everything here is owned by that ConfigMap, so deleting it removes the lot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pagoda.operator.autotune.keys import PRODUCT_LABEL, TuneKey
from pagoda.operator.autotune.profiles import profile_labels
from pagoda.operator.kube.names import (
    GPU_RESOURCE,
    LABEL_COMPONENT,
    MODEL_CACHE_MOUNT,
    cache_env,
    container_security,
    pod_security,
)
from pagoda.runtime import options

if TYPE_CHECKING:
    from pagoda.operator.spec.inference_service import InferenceServiceSpec
    from pagoda.operator.spec.model_ref import ModelRef

PodParts = Callable[[dict[str, Any], "InferenceServiceSpec", tuple[str, ...]], None]
JOB_COMPONENT = "tuning-job"
OUTPUT_DIR = "/profile"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where kopf's login looks
STARTUP_MARGIN_S = 900  # image pull + model load on top of the measuring budget
PUBLISH_VERBS = ("get", "patch")


def _meta(kind: str, api_version: str, name: str, namespace: str, owner: Mapping[str, Any]):
    labels = {**profile_labels(), LABEL_COMPONENT: JOB_COMPONENT}
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        # no blockOwnerDeletion: under the OwnerReferencesPermissionEnforcement admission plugin
        # (OpenShift, hardened clusters) it needs `update` on configmaps/finalizers, which the
        # operator does not hold, and it only matters to a foreground deletion of the ConfigMap
        # (the autotuner deletes it in the background: the garbage collector removes these)
    }
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [ref],
        },
    }


def build_rbac(key: TuneKey, namespace: str, profile_cm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """ServiceAccount + Role (get/patch on the one ConfigMap) + RoleBinding, in create order."""
    name = key.job_name
    sa = _meta("ServiceAccount", "v1", name, namespace, profile_cm)
    sa["automountServiceAccountToken"] = False
    role = _meta("Role", "rbac.authorization.k8s.io/v1", name, namespace, profile_cm)
    role["rules"] = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [key.profile_name],
            "verbs": list(PUBLISH_VERBS),
        }
    ]
    binding = _meta("RoleBinding", "rbac.authorization.k8s.io/v1", name, namespace, profile_cm)
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    binding["subjects"] = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    return [sa, role, binding]


def tune_args(key: TuneKey, spec: InferenceServiceSpec) -> list[str]:
    """`pagoda tune` arguments, rendered with the runtime's own flag table."""
    values = {
        "model": key.model,
        "revision": spec.model.commit,  # an hf:// branch's pin: the commit the pods serve
        # hf:// and s3://: the model-cache volume the download init container filled, as serving
        "download_dir": MODEL_CACHE_MOUNT if spec.model.remote else None,
        "dtype": key.dtype,
        "attention_backend": key.attention_backend,
        "block_size": key.block_size,
        "max_model_len": key.max_model_len,
        "quantization": key.quantization,
        "kv_cache_dtype": key.kv_cache_dtype if key.kv_cache_dtype != "auto" else None,
        "output": OUTPUT_DIR,
        "time_budget": f"{spec.autotune.time_budget_seconds}s",
        "ttft_target": key.ttft_target_s,
        "itl_target": key.itl_target_s,
    }
    out: list[str] = []
    for dest, value in values.items():
        if value is not None:
            out += options.TUNE_FLAGS[dest].render(value)
    return out


def _volumes(model: ModelRef) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "profile", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [
        {"name": "profile", "mountPath": OUTPUT_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    model.add_volume(volumes, mounts)
    return volumes, mounts


def _token_volume() -> dict[str, Any]:
    """What the kubelet would automount, as a volume only the publish container mounts."""
    return {
        "name": "api-token",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }  # fmt: skip


def _containers(key: TuneKey, spec: InferenceServiceSpec, namespace: str, mounts: list) -> tuple:
    r = spec.resources
    tune = {
        "name": "tune",
        "image": key.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["pagoda", "tune"],
        "args": tune_args(key, spec),
        "env": cache_env(),
        "resources": {
            "requests": {"cpu": r.cpu, "memory": r.memory, GPU_RESOURCE: "1"},
            "limits": {"memory": r.memory_limit or r.memory, GPU_RESOURCE: "1"},
        },
        "securityContext": container_security(),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    publish = {
        "name": "publish",
        "image": key.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["pagoda", "publish-profile"],
        "args": ["--dir", OUTPUT_DIR, "--configmap", f"{namespace}/{key.profile_name}"],
        "env": cache_env(),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": container_security(),
        "volumeMounts": [
            {"name": "profile", "mountPath": OUTPUT_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "api-token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return tune, publish


def build_job(
    key: TuneKey,
    spec: InferenceServiceSpec,
    namespace: str,
    profile_cm: Mapping[str, Any],
    *,
    pod_parts: PodParts | None = None,
    pull_secrets: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One attempt at tuning `key`: no Job-level retries (the operator retries with backoff).

    `pull_secrets`: the `imagePullSecrets` of the namespace's `default` ServiceAccount, which the
    serving pods run under (a private registry's secret goes there, docs/deploy.md); the Job's pod
    runs under its own ServiceAccount, so it names them itself to pull the same image.

    `pod_parts(pod_spec, spec, readers)` adds what the serving pods add for the model too (main.py
    passes children/model_cache.py's `add_model_download`: an hf:// or s3:// model is downloaded
    by an init container before `tune` reads it offline); autotune/ may not import children/.
    """
    job = _meta("Job", "batch/v1", key.job_name, namespace, profile_cm)
    volumes, mounts = _volumes(spec.model)
    tune, publish = _containers(key, spec, namespace, mounts)
    tolerations = [dict(t) for t in spec.tolerations]
    if not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    pod_labels = dict(job["metadata"]["labels"])
    job["spec"] = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": spec.autotune.time_budget_seconds + STARTUP_MARGIN_S,
        "ttlSecondsAfterFinished": 7 * 24 * 3600,
        "template": {
            "metadata": {"labels": pod_labels},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": key.job_name,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "nodeSelector": {**dict(spec.node_selector), PRODUCT_LABEL: key.product},
                "tolerations": tolerations,
                "securityContext": pod_security(spec.pod_ids),
                "initContainers": [tune],
                "containers": [publish],
                "volumes": [*volumes, _token_volume()],
            },
        },
    }
    if pull_secrets:
        job["spec"]["template"]["spec"]["imagePullSecrets"] = [dict(s) for s in pull_secrets]
    if pod_parts is not None:
        pod_parts(job["spec"]["template"]["spec"], spec, ("tune",))
    return job


def job_outcome(job: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """("absent" | "suspended" | "running" | "succeeded" | "failed", reason, message) from the
    Job's status. "suspended": `spec.suspend` (a queue such as Kueue creates Jobs suspended and
    resumes them once it admits them), so no pod runs and nothing is measured yet."""
    if job is None:
        return "absent", "", ""
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Failed":
            reason = cond.get("reason") or "JobFailed"
            return "failed", reason, cond.get("message") or "the tuning Job failed"
        if cond.get("type") == "Complete":
            return "succeeded", "Complete", ""
    if status.get("failed"):
        return "failed", "JobFailed", "the tuning pod failed"
    if status.get("succeeded"):
        return "succeeded", "Complete", ""
    if (job.get("spec") or {}).get("suspend"):
        cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Suspended"), {})
        why = cond.get("message") or "spec.suspend is true"
        return "suspended", "JobSuspended", f"{why}: waiting for its queue (e.g. Kueue) to admit it"
    return "running", "", ""
