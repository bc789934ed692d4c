"""Shared by the chart tests: render charts/pagoda with Helm's own Go SDK (helm-python-sdk,
no helm binary), value sets to render, and strict validation of every rendered document.

Custom resources are checked against trimmed copies of the Prometheus Operator CRD schemas
(chart_cr_schemas.py); everything else with kubernetes-validate in strict mode.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml
from chart_cr_schemas import CR_SCHEMAS
from prometheus_testlib import require_tool as require_tool  # the chart tests' tools

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pagoda"
RELEASE = "pagoda"
NAMESPACE = "pagoda-system"
# A current Kubernetes and the oldest the chart declares (Chart.yaml kubeVersion).
K8S_VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())

MONITORING_ON: dict[str, Any] = {
    "monitoring": {
        "labels": {"release": "kube-prometheus-stack"},
        "operatorServiceMonitor": {"enabled": True},
        "runtimeServiceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "alertmanagerConfig": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "folder": "LLM"},
    },
    "prometheus": {
        "url": "http://prometheus-operated.monitoring.svc:9090",
        "allowedURLs": [
            "http://prometheus-operated.monitoring.svc:9090",
            "https://thanos.example/a",
        ],
    },
    "webhook": {"tokenSecret": {"create": True}},
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "monitoring": MONITORING_ON,
    "namespaced-monitoring": {**MONITORING_ON, "watchNamespaces": ["llm"]},
    "autotune-off": {
        "autotune": {"enabled": False},
        "modelPinning": {"enabled": False},
        "watchNamespaces": ["llm"],
    },
    # several replicas (kopf peering) and TLS on the operator's port
    "ha": {"operator": {"replicas": 2}},
    "ha-namespaced-tls": {
        **MONITORING_ON,
        "operator": {"replicas": 3, "peering": {"lifetime": 20}},
        "watchNamespaces": ["team-a", "team-b"],
        "webhook": {"tokenSecret": {"create": True}, "tls": {"secretName": "operator-tls"}},
    },
    "custom-images": {
        "operator": {
            "image": {"repository": "registry.example.com/pagoda/operator", "tag": "1.2.3"},
            "imagePullSecrets": [{"name": "regcred"}],
            "logFormat": "plain",
            "verbose": True,
            "httpPort": 9090,
            "podLabels": {"team": "ml"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
                {
                    "key": "gpu",
                    "operator": "Equal",
                    "value": "no",
                    "effect": "NoExecute",
                    "tolerationSeconds": 60,
                },
            ],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"team": "ml"}},
                            },
                        }
                    ]
                }
            },
            "resources": {"requests": {"cpu": 0.1, "memory": "256Mi"}, "limits": {"cpu": 1}},
            "extraEnv": [
                {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ],
        },
        "runtime": {
            "image": {
                "repository": "registry.example.com/pagoda/runtime",
                "digest": "sha256:" + "ab" * 32,
            }
        },
        "commonLabels": {"cost-center": "llm"},
        "service": {"port": 80},
        "fullnameOverride": "llm-serving",
        "webhook": {"tokenSecret": {"name": "alert-token", "key": "bearer"}},
    },
}


@functools.cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


def render_files(values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """{template path: rendered text}, as `helm template` would produce."""
    return _chart().render(dict(values or {}), name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rendered Kubernetes document (NOTES.txt and empty documents left out)."""
    docs = []
    for path, text in sorted(render_files(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("metadata", {})
                docs.append(doc)
    return docs


@functools.cache
def render_cached(value_set: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(VALUE_SETS[value_set]))


def of_kind(docs: Iterator[dict[str, Any]] | list[dict[str, Any]] | tuple, kind: str) -> list:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Any, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def operator_service(docs: Any) -> dict[str, Any]:
    """The operator Service (the Deployment's name; not the headless metrics Service)."""
    return one(docs, "Service", one(docs, "Deployment")["metadata"]["name"])


def operator_container(docs: Any) -> dict[str, Any]:
    deployment = one(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def validation_errors(doc: Mapping[str, Any], version: str) -> list[str]:
    """Strict schema errors of one document: kubernetes-validate for built-in kinds, the
    embedded Prometheus Operator schemas for its custom resources."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if key in CR_SCHEMAS:
        validator = jsonschema.Draft7Validator(CR_SCHEMAS[key])
        return [
            f"{where}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(dict(doc), version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{where}: no schema for {key} in Kubernetes {version}"]
    return []
