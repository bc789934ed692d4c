"""The LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`, kubernetes-sigs/lws) of a multi-node
service: `spec.parallelism.nodes` pods per group, `replicas` groups. Pure.

* the **leader** (pod 0) runs the server's pod template (children/deployment.py, so everything the
  Deployment's pods get, they get): the HTTP server, probes, metrics, and rank 0 of the group,
  labelled `serving.pagoda.dev/role: leader`; the Service selects only leaders;
* the **workers** (pods 1..nodes-1) run the same container headless: `--node-rank
  $(LWS_WORKER_INDEX)`, no port, no probes (the leader's /health turns 503 when a rank dies),
  no scrape annotations;
* every pod meets at `--master-addr $(LWS_LEADER_ADDRESS)` (LWS's pod webhook sets both variables);
* `restartPolicy: RecreateGroupOnPodRestart`: one rank lost means the group restarts together;
* `startupPolicy: LeaderCreated`: the workers start with the leader, since the leader is ready only
  once the whole group has loaded the model (`LeaderReady` would wait forever);
* rolling updates as the Deployment's (one group down at a time with GPUs, none surging).

Named `NAME-lws`: LWS names a headless Service after itself, which must not take our Service's name.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from pagoda.operator.children.owner import adopt, child
from pagoda.operator.children.serve_args import server_args
from pagoda.operator.kube.names import LABEL_ROLE, LEADER, WORKER, lws_name

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

API_VERSION = "leaderworkerset.x-k8s.io/v1"
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
_HTTP_ONLY = ("ports", "startupProbe", "livenessProbe", "readinessProbe", "lifecycle")


def _with_role(template: dict[str, Any], role: str) -> dict[str, Any]:
    template["metadata"]["labels"][LABEL_ROLE] = role
    return template


def worker_template(leader: dict[str, Any], spec: InferenceServiceSpec) -> dict[str, Any]:
    """The leader's pod template, headless: the worker's command line, no HTTP side."""
    worker = copy.deepcopy(leader)
    annotations = worker["metadata"]["annotations"]
    server = annotations.get(DEFAULT_CONTAINER)  # the `pagoda serve` container
    for key in [k for k in annotations if k.startswith("prometheus.io/")]:
        del annotations[key]
    for container in worker["spec"]["containers"]:
        if container["name"] == server:
            container["args"] = server_args(spec, WORKER)
            for key in _HTTP_ONLY:
                container.pop(key, None)
    return _with_role(worker, WORKER)


def build_leader_worker_set(
    owner: Owner,
    spec: InferenceServiceSpec,
    *,
    pod_template: dict[str, Any],
    rolling_update: dict[str, int],
    current_replicas: int | None = None,
    replacing: bool = False,
) -> dict[str, Any]:
    """The LeaderWorkerSet from the server's pod template and the Deployment's rolling-update
    bounds (children/deployment.py: the same pods, rolled the same way). `replicas` (groups) is
    left out once the autoscaler owns it, as the Deployment's is
    (`InferenceServiceSpec.desired_replicas`; `replacing`: `current_replicas` are a
    Deployment's that this LeaderWorkerSet replaces)."""
    obj = child(owner, "LeaderWorkerSet", API_VERSION, lws_name(owner.name))
    leader = _with_role(copy.deepcopy(pod_template), LEADER)
    replicas = spec.desired_replicas(current_replicas, replacing=replacing)
    obj["spec"] = {
        **({"replicas": replicas} if replicas is not None else {}),
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": rolling_update},
        "leaderWorkerTemplate": {
            "size": spec.parallelism.nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": leader,
            "workerTemplate": worker_template(leader, spec),
        },
    }
    return adopt(obj, owner)
