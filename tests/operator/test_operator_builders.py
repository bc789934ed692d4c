"""Every builder: valid Kubernetes (kubernetes-validate, strict) and the properties that matter."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
from kube_emulator import merge_patch
from pagoda.operator.children.build import build_children
from pagoda.operator.children.config_map import build_config_map, config_hash
from pagoda.operator.children.deployment import PRESTOP_SLEEP_S, build_deployment
from pagoda.operator.children.owner import Owner
from pagoda.operator.children.service import build_service
from pagoda.operator.kube import drift, names
from pagoda.operator.spec.inference_service import InferenceServiceSpec

K8S_VERSIONS = (
    "1.29.0",  # the oldest supported (charts/pagoda/Chart.yaml kubeVersion, README)
    "1.32.0",
    kubernetes_validate.utils.latest_version(),
)  # the oldest supported, kubectl's here, newest bundled
OWNER = Owner(
    name="demo",
    namespace="team-a",
    uid="0b7e2f8e-1111-4c1e-9a34-5a1d2c3b4e5f",
    labels=(("team", "a"),),
)


def parse(spec: dict[str, Any]) -> InferenceServiceSpec:
    return InferenceServiceSpec.from_dict(
        spec, name=OWNER.name, default_image="ghcr.io/x/pagoda-runtime:1.0"
    )


CPU = parse({"model": "smollm2-135m"})
GPU = parse(
    {
        "model": "pvc://models/llama-3.1-8b",
        "servedModelName": "llama",
        "replicas": 3,
        "resources": {"gpus": 2, "cpu": 8, "memory": "32Gi", "cpuLimit": "16", "memoryLimit": "40Gi"},
        "engine": {
            "dtype": "bfloat16", "maxNumSeqs": 128, "maxNumBatchedTokens": 8192, "maxModelLen": 8192,
            "blockSize": 32, "enablePrefixCaching": False, "enableChunkedPrefill": False,
            "maxQueueLen": 100, "attentionBackend": "triton", "extraArgs": ["--seed", "7"],
        },
        "apiKeySecretRef": {"name": "llama-key"},
        "nodeSelector": {"gpu": "h200"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "env": [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "HOME", "value": "/data"}],
        "drainTimeoutSeconds": 60,
        "startupTimeoutSeconds": 600,
    }
)  # fmt: skip


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --- validity --------------------------------------------------------------------------------

SERVICE_MONITOR_SCHEMA = {  # the fields we use, from prometheus-operator's CRD
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}},
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["sourceLabels", "targetLabel"],
                                    "properties": {
                                        "action": {"enum": ["replace", "keep", "drop"]},
                                        "sourceLabels": {
                                            "type": "array",
                                            "items": {
                                                "type": "string",
                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$",
                                            },
                                        },
                                        "targetLabel": {"type": "string"},
                                    },
                                },
                            },
                            "interval": {
                                "type": "string",
                                "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("spec", [CPU, GPU], ids=["cpu", "gpu"])
def test_every_child_passes_kubernetes_validate_strict(
    spec: InferenceServiceSpec, version: str
) -> None:
    children = build_children(OWNER, spec, service_monitor=True)
    kinds = [c["kind"] for c in children.desired]
    assert kinds[:3] == ["ConfigMap", "Deployment", "Service"] and "ServiceMonitor" in kinds
    for child in children.desired:
        if child["kind"] == "ServiceMonitor":  # a custom resource: no bundled schema
            jsonschema.validate(child, SERVICE_MONITOR_SCHEMA)
            as_builtin = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": child["metadata"]}
            kubernetes_validate.validate(as_builtin, version, strict=True)  # its metadata is valid
        else:
            kubernetes_validate.validate(child, version, strict=True)


def test_validation_is_not_vacuous() -> None:
    deploy = build_deployment(OWNER, CPU, config_hash_value="h")
    container(deploy)["securityContext"]["runAsNonRot"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, "1.32.0", strict=True)


# --- ownership and labels ----------------------------------------------------------------------


def test_children_are_adopted_and_labelled() -> None:
    for child in build_children(OWNER, GPU, service_monitor=True).desired:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService", "name": "demo",
            "uid": OWNER.uid, "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert names.standard_labels("demo").items() <= meta["labels"].items()
        assert meta["labels"]["team"] == "a"  # the owner's labels (kopf.adopt)


def test_selectors_use_only_fixed_labels() -> None:
    children = build_children(OWNER, GPU)
    deploy, svc, pdb = (
        children.get("Deployment"),
        children.get("Service"),
        children.get("PodDisruptionBudget"),
    )
    selector = names.selector_labels("demo")
    assert deploy["spec"]["selector"]["matchLabels"] == selector
    assert svc["spec"]["selector"] == selector
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert "team" not in deploy["spec"]["template"]["metadata"]["labels"]


# --- the Deployment ---------------------------------------------------------------------------------


def test_deployment_runs_pagoda_serve_with_engine_args() -> None:
    c = container(build_deployment(OWNER, GPU, config_hash_value="h"))
    args = c["args"]
    assert c["command"] == ["pagoda", "serve"]
    assert flag(args, "--model") == "/mnt/models/llama-3.1-8b"
    assert flag(args, "--served-model-name") == "llama"
    assert flag(args, "--host") == "0.0.0.0" and flag(args, "--port") == "8000"
    assert flag(args, "--dtype") == "bfloat16"
    assert flag(args, "--max-num-seqs") == "128"
    assert flag(args, "--max-num-batched-tokens") == "8192"
    assert flag(args, "--max-model-len") == "8192"
    assert flag(args, "--block-size") == "32"
    assert flag(args, "--max-queue-len") == "100"
    assert flag(args, "--attention-backend") == "triton"
    assert flag(args, "--drain-timeout") == "60"
    assert "--no-enable-prefix-caching" in args and "--no-enable-chunked-prefill" in args
    assert args[-2:] == ["--seed", "7"]
    cpu_args = container(build_deployment(OWNER, CPU, config_hash_value="h"))["args"]
    assert (
        flag(cpu_args, "--model") == "smollm2-135m"
        and flag(cpu_args, "--served-model-name") == "smollm2-135m"
    )
    assert "--enable-prefix-caching" in cpu_args and "--max-num-seqs" not in cpu_args


def test_probes_drain_and_grace_period() -> None:
    deploy = build_deployment(OWNER, GPU, config_hash_value="h")
    c = container(deploy)
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # startupTimeoutSeconds
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_SLEEP_S)]
    grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > PRESTOP_SLEEP_S + 60  # preStop + --drain-timeout fit inside
    assert deploy["spec"]["progressDeadlineSeconds"] > 600


def test_restricted_security_context() -> None:
    pod = build_deployment(OWNER, CPU, config_hash_value="h")["spec"]["template"]["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {
        "type": "RuntimeDefault"
    }
    assert (
        pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    )
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert sc["readOnlyRootFilesystem"] is True and "/tmp" in mounts  # writable scratch only


@pytest.mark.parametrize(
    ("ids", "want"),
    [
        ({}, {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}),  # the image's user
        ({"run_as_user": None, "run_as_group": None, "fs_group": None}, {}),  # OpenShift's SCC
        ({"run_as_user": 1000700000, "fs_group": None}, {"runAsUser": 1000700000, "runAsGroup": 1000}),
    ],
)  # fmt: skip
def test_pod_ids_come_from_the_operator_config(ids: dict[str, Any], want: dict[str, Any]) -> None:
    """The model-server and tuning pods get the operator's pod ids (`--pod-run-as-user` ...); a
    None one is left out for the platform to assign (OpenShift's restricted SCC refuses a pod
    that names a uid outside the namespace's range), the pod stays non-root either way."""
    from pagoda.operator.autotune import jobs, profiles
    from pagoda.operator.autotune.keys import key_for
    from pagoda.operator.spec import validation
    from pagoda.operator.spec.config import OperatorConfig

    config = OperatorConfig(pod_ids=names.PodIds(**ids))
    body = {"metadata": {"name": "demo"}, "spec": {"model": "hf://org/m", "resources": {"gpus": 1},
                                                   "autotune": {"enabled": True}}}  # fmt: skip
    spec = validation.parse(body, config)
    deploy = build_deployment(OWNER, spec, config_hash_value="h")
    key = key_for(spec, "H200")
    cm = profiles.build_profile_config_map(key, "default")
    cm["metadata"]["uid"] = "uid-cm"
    job = jobs.build_job(key, spec, "default", cm)
    for obj in (deploy, job):
        sc = obj["spec"]["template"]["spec"]["securityContext"]
        assert sc == {"runAsNonRoot": True, **want, "seccompProfile": {"type": "RuntimeDefault"}}
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)  # raises if invalid
    with pytest.raises(ValueError, match="run_as_user"):
        names.PodIds(run_as_user=0)  # runAsNonRoot would refuse it at the kubelet


def test_gpu_resources_volume_key_and_scheduling() -> None:
    pod = build_deployment(OWNER, GPU, config_hash_value="h")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
        "limits": {"cpu": "16", "memory": "40Gi", "nvidia.com/gpu": "2"},
    }
    (model_vol,) = [v for v in pod["volumes"] if v["name"] == "model"]
    assert model_vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in c["volumeMounts"]
    assert {
        "name": "PAGODA_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llama-key", "key": "api-key"}},
    } in c["env"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LOG_LEVEL"] == "debug" and env["HOME"] == "/data"  # the user's HOME wins
    assert [e["name"] for e in c["env"]].count("HOME") == 1
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    cpu = build_deployment(OWNER, CPU, config_hash_value="h")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    assert "tolerations" not in cpu and "nodeSelector" not in cpu
    assert not [v for v in cpu["volumes"] if v["name"] == "model"]


def test_prometheus_annotations_and_config_hash() -> None:
    cm = build_config_map(OWNER, GPU)
    deploy = build_deployment(OWNER, GPU, config_hash_value=config_hash(cm))
    annotations = deploy["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations["prometheus.io/scrape"] == "true"
        and annotations["prometheus.io/port"] == "8000"
    )
    assert annotations["prometheus.io/path"] == "/metrics"
    assert annotations[names.CONFIG_HASH_ANNOTATION] == config_hash(cm)


def test_spec_change_changes_the_pod_template_hash() -> None:
    base = {"model": "smollm2-135m", "engine": {"maxNumSeqs": 8}}
    changed = copy.deepcopy(base)
    changed["engine"]["maxNumSeqs"] = 16

    def template_hash(spec: dict[str, Any]) -> str:
        deploy = build_children(OWNER, parse(spec)).get("Deployment")
        return deploy["spec"]["template"]["metadata"]["annotations"][names.CONFIG_HASH_ANNOTATION]

    assert template_hash(base) == template_hash(copy.deepcopy(base))  # deterministic
    assert template_hash(base) != template_hash(changed)


def test_config_map_records_the_engine_configuration() -> None:
    import json

    cm = build_config_map(OWNER, GPU)
    assert cm["metadata"]["name"] == "demo-config"
    engine = json.loads(cm["data"]["engine.json"])
    assert (
        engine["maxNumSeqs"] == 128
        and engine["dtype"] == "bfloat16"
        and engine["model"] == "pvc://models/llama-3.1-8b"
    )
    assert cm["data"]["serve-args"].startswith("pagoda serve --model /mnt/models/llama-3.1-8b ")


def test_replicas_follow_spec_or_autoscaler() -> None:
    assert (
        build_deployment(OWNER, GPU, config_hash_value="h", current_replicas=7)["spec"]["replicas"]
        == 3
    )
    auto = parse(
        {
            "model": "smollm2-135m",
            "replicas": 9,
            "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "targetQueueDepth": 4},
        }
    )

    def replicas(current: int | None) -> int | None:
        return build_deployment(OWNER, auto, config_hash_value="h", current_replicas=current)[
            "spec"
        ].get("replicas")

    assert replicas(None) == 2  # new Deployment: minReplicas
    # afterwards the autoscaler is the only writer: the reconciler leaves the field out
    assert replicas(4) is None and replicas(1) is None and replicas(9) is None


def test_gpu_rollout_does_not_surge() -> None:
    assert build_deployment(OWNER, GPU, config_hash_value="h")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0, "maxUnavailable": 1,
    }  # fmt: skip
    assert build_deployment(OWNER, CPU, config_hash_value="h")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1, "maxUnavailable": 0,
    }  # fmt: skip


# --- Service, PDB, ServiceMonitor -----------------------------------------------------------------


def test_service() -> None:
    svc = build_service(OWNER)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_pdb_only_with_more_than_one_replica() -> None:
    single = build_children(OWNER, CPU)
    assert "PodDisruptionBudget" not in [c["kind"] for c in single.desired]
    assert ("PodDisruptionBudget", "demo") in single.absent
    multi = build_children(OWNER, GPU)
    pdb = multi.get("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    auto = parse(
        {"model": "smollm2-135m", "autoscaling": {"maxReplicas": 3, "targetTTFTSeconds": 0.5}}
    )
    assert "PodDisruptionBudget" in [c["kind"] for c in build_children(OWNER, auto).desired]


def test_service_monitor_only_when_the_api_exists() -> None:
    assert "ServiceMonitor" not in [c["kind"] for c in build_children(OWNER, CPU).desired]
    # --no-service-monitors: another owns scraping, so the operator's own must go
    off = build_children(OWNER, CPU, service_monitor=True, own_service_monitor=False)
    assert "ServiceMonitor" not in [c["kind"] for c in off.desired]
    assert ("ServiceMonitor", "demo") in off.absent
    sm = build_children(OWNER, CPU, service_monitor=True).get("ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"] == names.selector_labels("demo")
    (endpoint,) = sm["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http", "/metrics", "5s")
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {
        "namespace": ["__meta_kubernetes_namespace"],
        "inferenceservice": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "pod": ["__meta_kubernetes_pod_name"],
    }


def test_monitoring_labels_on_service_monitor_and_rule_and_updated_on_reconcile() -> None:
    """--monitoring-label (e.g. kube-prometheus-stack's `release`) on both monitoring children,
    over an owner label of the same key; adding or dropping one is drift the next reconcile
    patches."""
    auto = parse(
        {"model": "smollm2-135m", "autoscaling": {"maxReplicas": 3, "targetQueueDepth": 4}}
    )
    owner = Owner(OWNER.name, OWNER.namespace, OWNER.uid, labels=(("release", "mine"),))
    kps = (("release", "kube-prometheus-stack"), ("example.com/scrape", ""))

    def monitoring(labels: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
        built = build_children(
            owner, auto, service_monitor=True, prometheus_rule=True, monitoring_labels=labels
        )
        return [c for c in built.desired if c["kind"] in ("ServiceMonitor", "PrometheusRule")]

    before, after = monitoring(()), monitoring(kps)
    assert [c["kind"] for c in after] == ["ServiceMonitor", "PrometheusRule"]
    for old, new in zip(before, after, strict=True):
        assert old["metadata"]["labels"]["release"] == "mine"
        assert new["metadata"]["labels"] == {**old["metadata"]["labels"], **dict(kps)}
        live = drift.recorded(old)  # made before the flag
        for want in (drift.recorded(new), drift.recorded(old)):  # flag added, then taken off
            assert drift.needs_update(want, live)
            live = merge_patch(live, drift.merge_patch(want, live))
            assert live["metadata"]["labels"] == want["metadata"]["labels"]
            assert not drift.needs_update(want, live)
    # the Deployment and Service keep their labels
    plain = build_children(owner, auto, monitoring_labels=kps)
    assert "example.com/scrape" not in plain.workload["metadata"]["labels"]


def test_builders_are_pure() -> None:
    first = build_children(OWNER, GPU, service_monitor=True)
    second = build_children(OWNER, GPU, service_monitor=True)
    assert first == second
    first.desired[1]["spec"]["replicas"] = 99
    assert build_children(OWNER, GPU).get("Deployment")["spec"]["replicas"] == 3


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_events_are_valid(version: str) -> None:
    from pagoda.operator.kube.client import event_body

    owner = {"apiVersion": "serving.pagoda.dev/v1alpha1", "kind": "InferenceService",
             "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid}}  # fmt: skip
    event = event_body(
        owner,
        type_="Warning",
        reason="UnknownModel",
        message="x" * 5000,
        component="pagoda-operator",
    )
    kubernetes_validate.validate(event, version, strict=True)
    assert event["involvedObject"]["uid"] == OWNER.uid and len(event["message"]) == 1024


def test_the_owners_labels_never_replace_the_standard_ones() -> None:
    """`kopf.adopt` adds the owner's labels only where the child sets none: an owner labelled
    like the children cannot change their selectors or the managed-by label."""
    owner = Owner(
        name="demo", namespace="team-a", uid="u",
        labels=(("app.kubernetes.io/managed-by", "someone"), ("app.kubernetes.io/name", "x"),
                ("team", "a")),
    )  # fmt: skip
    for child in build_children(owner, GPU, service_monitor=True, prometheus_rule=True).desired:
        labels = child["metadata"]["labels"]
        assert names.standard_labels("demo").items() <= labels.items(), child["kind"]
        assert labels["team"] == "a"
        assert len(child["metadata"]["ownerReferences"]) == 1


def test_spec_and_policy_import_without_aiohttp() -> None:
    """The pure half of the operator below the children (spec, status, drift, the serve_args
    contract, the autoscaling policy and rules) needs neither aiohttp nor kopf: a fresh
    interpreter that refuses to import them loads it. (The children use `kopf.adopt`.)"""
    code = textwrap.dedent(
        """
        import sys

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("aiohttp", "kopf"):
                    raise ImportError(f"{name} must not be imported here")
                return None

        sys.meta_path.insert(0, Refuse())
        from pagoda.operator.autoscaling import policy, rules
        from pagoda.operator.children import serve_args
        from pagoda.operator.kube import drift, names
        from pagoda.operator.spec import inference_service, status
        parsed = inference_service.InferenceServiceSpec.from_dict(
            {"model": "smollm2-135m", "autoscaling": {"maxReplicas": 2, "targetQueueDepth": 1}},
            name="a", default_image="img:1")
        assert "--served-model-name" in serve_args.server_args(parsed)
        assert rules.service_rules("b", "a", parsed)["groups"]
        assert policy.Policy.from_spec(parsed.autoscaling).max_replicas == 2
        assert not {m for m in sys.modules if m.split(".")[0] in ("aiohttp", "kopf")}
        """
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def _labels_in(obj: Any) -> list[dict[str, str]]:
    """Every `labels` map in a manifest (its own, its pod templates', its selectors')."""
    if isinstance(obj, dict):
        own = [obj[k] for k in ("labels", "matchLabels") if isinstance(obj.get(k), dict)]
        return own + [m for v in obj.values() for m in _labels_in(v)]
    return [m for v in obj for m in _labels_in(v)] if isinstance(obj, list) else []


@pytest.mark.parametrize(("length", "extra"), [
    (52, {"replicas": 2, "autoscaling": {"maxReplicas": 3, "targetTTFTSeconds": 0.5}}),
    (45, {"replicas": 2, "resources": {"gpus": 8}, "parallelism": {"nodes": 2}}),
])  # fmt: skip
def test_the_longest_names_fit_kubernetes_limits(length: int, extra: dict[str, Any]) -> None:
    """The longest InferenceService names the CRD takes (52; 45 for a multi-node service): every
    child's name fits 63 characters (a Service's a DNS-1035 label), every label key and value
    is valid, and a LeaderWorkerSet's worker StatefulSets (LWS-99) leave room for the
    controller-revision-hash label LWS puts on their pods (the name, '-', a 10-character hash)."""
    name = "n" + "x" * (length - 1)
    owner = Owner(name=name, namespace="team-a", uid=OWNER.uid, labels=(("team", "a"),))
    spec = InferenceServiceSpec.from_dict(
        {"model": "pvc://models/m", **extra}, name=name, default_image="img:1"
    )
    children = build_children(owner, spec, service_monitor=True, prometheus_rule=True,
                              monitoring_labels=(("p" * 253 + "/" + "n" * 63, "v" * 63),))  # fmt: skip
    kinds = {c["kind"] for c in children.desired}
    assert {"Service", "ServiceMonitor", "PodDisruptionBudget", "ConfigMap"} <= kinds
    assert ("PrometheusRule" in kinds) == ("autoscaling" in extra)
    assert ("LeaderWorkerSet" in kinds) == ("parallelism" in extra)
    for child in children.desired:
        child_name = child["metadata"]["name"]
        assert len(child_name) <= 63 and names.is_label_value(child_name), child_name
        if child["kind"] == "Service":
            assert child_name[0].isalpha() and "." not in child_name
        for labels in _labels_in(child):
            assert all(names.is_label_key(k) and names.is_label_value(v)
                       for k, v in labels.items()), (child["kind"], labels)  # fmt: skip
        if child["kind"] == "LeaderWorkerSet":
            assert len(f"{child_name}-99") + 11 <= 63
