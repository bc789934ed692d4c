"""operator.replicas > 1 (kopf peering) and webhook.tls (HTTPS on the operator's port): what the
chart ships for them, checked against the operator's own flags and constants."""

from __future__ import annotations

import argparse
from typing import Any

from chart_helpers import (
    NAMESPACE,
    VALUE_SETS,
    of_kind,
    one,
    operator_container,
    operator_service,
    render_cached,
)
from pagoda.operator import main as operator_main
from pagoda.operator.kube.peering import PEERING_LABEL


def config_of(docs: Any) -> Any:
    parser = argparse.ArgumentParser(exit_on_error=False)
    operator_main.add_arguments(parser)
    return operator_main.config_from_args(parser.parse_args(operator_container(docs)["args"][1:]))


def env_names(docs: Any) -> set[str]:
    return {e["name"] for e in operator_container(docs)["env"]}


def test_one_replica_runs_standalone() -> None:
    docs = render_cached("defaults")
    assert config_of(docs).peering is None
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    for kind in ("ClusterKopfPeering", "KopfPeering", "PodDisruptionBudget", "Role"):
        assert of_kind(docs, kind) == []
    assert PEERING_LABEL not in operator_service(docs)["spec"]["selector"]
    container = operator_container(docs)
    assert config_of(docs).http_tls_cert is None
    assert "scheme" not in container["readinessProbe"]["httpGet"]  # plain HTTP


def test_two_replicas_peer_cluster_wide() -> None:
    docs = render_cached("ha")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # a new pod (a lower priority: it started later) joins as a standby before an old one goes
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    config = config_of(docs)
    peering = one(docs, "ClusterKopfPeering")
    assert config.peering == peering["metadata"]["name"] and config.peering_lifetime_s == 15
    assert of_kind(docs, "KopfPeering") == []
    assert {"POD_NAME", "POD_NAMESPACE"} <= env_names(docs)  # identity, the pod to label
    # the Service reaches the active pod only: the label the operator's gate writes
    selector = dict(operator_service(docs)["spec"]["selector"])  # not the cached render
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.pop(PEERING_LABEL) == "active"
    assert selector.items() <= pod_labels.items()
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    role = one(docs, "Role")  # patch pods, only in the release namespace
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_namespaced_replicas_peer_per_namespace_over_tls() -> None:
    values = VALUE_SETS["ha-namespaced-tls"]
    docs = render_cached("ha-namespaced-tls")
    config = config_of(docs)
    assert config.peering_lifetime_s == 20
    peerings = of_kind(docs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == values["watchNamespaces"]
    assert {p["metadata"]["name"] for p in peerings} == {config.peering}
    assert of_kind(docs, "ClusterKopfPeering") == []

    # TLS: the Secret's files, the probes over HTTPS, Alertmanager and Prometheus verify it
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "operator-tls"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert config.http_tls_cert == mount["mountPath"] + "/tls.crt"
    assert config.http_tls_key == mount["mountPath"] + "/tls.key"
    for probe in ("livenessProbe", "readinessProbe"):
        assert pod["containers"][0][probe]["httpGet"]["scheme"] == "HTTPS"
    service = operator_service(docs)
    host = f"{service['metadata']['name']}.{NAMESPACE}.svc"
    expected_tls = {"ca": {"secret": {"name": "operator-tls", "key": "ca.crt"}}, "serverName": host}
    (webhook,) = one(docs, "AlertmanagerConfig")["spec"]["receivers"][0]["webhookConfigs"]
    assert webhook["url"] == f"https://{host}:{service['spec']['ports'][0]['port']}/alerts"
    assert webhook["httpConfig"]["tlsConfig"] == expected_tls
    assert webhook["httpConfig"]["authorization"]["type"] == "Bearer"
    monitor = one(docs, "ServiceMonitor", service["metadata"]["name"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == expected_tls
