"""charts/pagoda: Helm's linter, rendering with several value sets, strict schema validation of
every document, and the operator Deployment's contract with `pagoda operator`."""

from __future__ import annotations

import argparse
import base64
import re
import shlex
import subprocess
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import (
    CHART,
    K8S_VERSIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    VALUE_SETS,
    of_kind,
    one,
    operator_container,
    operator_service,
    render,
    render_cached,
    render_files,
    require_tool,
    validation_errors,
)
from pagoda.operator import main as operator_main
from pagoda.operator.web.server import OperatorHttpServer

SELECTOR_KEYS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
}
NAMESPACED_KINDS = {
    "Deployment",
    "Service",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "Role",
    "RoleBinding",
    "ServiceMonitor",
    "PrometheusRule",
    "AlertmanagerConfig",
    "KopfPeering",
    "PodDisruptionBudget",
}


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_helm_lint_reports_no_errors_or_warnings(value_set: str) -> None:
    report = helm.lint(
        str(CHART),
        VALUE_SETS[value_set],
        namespace=NAMESPACE,
        strict=True,
        kube_version=f"v{K8S_VERSIONS[-1]}",
    )
    assert report["errors"] == []
    assert report["total_charts_linted"] == 1
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_document_passes_strict_validation(value_set: str) -> None:
    docs = render_cached(value_set)
    assert docs, "nothing rendered"
    errors = [
        e for version in K8S_VERSIONS for doc in docs for e in validation_errors(doc, version)
    ]
    assert errors == []


def test_validation_catches_mistakes() -> None:
    """The validators are strict: an unknown field fails (built-in kinds and custom resources)."""
    docs = [dict(d) for d in render_cached("monitoring")]
    deployment = one(docs, "Deployment")
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    assert validation_errors(deployment, K8S_VERSIONS[-1])
    monitor = dict(of_kind(docs, "ServiceMonitor")[0])
    monitor["spec"] = {**monitor["spec"], "endpoint": []}
    assert validation_errors(monitor, K8S_VERSIONS[-1])


def test_expected_objects_per_value_set() -> None:
    kinds = {name: sorted(d["kind"] for d in render_cached(name)) for name in VALUE_SETS}
    assert kinds["defaults"] == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    assert kinds["namespaced"] == sorted(kinds["defaults"] + ["Role", "RoleBinding"] * 2)
    assert sorted(set(kinds["monitoring"]) - set(kinds["defaults"])) == [
        "AlertmanagerConfig",
        "ConfigMap",
        "PrometheusRule",
        "Secret",
        "ServiceMonitor",
    ]
    assert kinds["monitoring"].count("ServiceMonitor") == 2


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_names_namespaces_and_labels(value_set: str) -> None:
    docs = render_cached(value_set)
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "duplicate objects"
    for doc in docs:
        meta = doc["metadata"]
        assert len(meta["name"]) <= 63
        if doc["kind"] in NAMESPACED_KINDS:
            assert meta.get("namespace"), f"{doc['kind']}/{meta['name']} has no namespace"
        else:
            assert "namespace" not in meta
        labels = meta["labels"]
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"].startswith("pagoda-")
        if doc["kind"] in ("Deployment", "Service", "ServiceAccount", "Secret"):
            assert meta["namespace"] == NAMESPACE


DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@pytest.mark.parametrize(
    ("release", "override"),
    [("r" * 53, {"nameOverride": "n" * 53}), (RELEASE, {"fullnameOverride": "f" * 53})],
)
def test_the_longest_names_stay_within_kubernetes_limits(release: str, override: dict) -> None:
    """The longest names Helm and the chart's schema allow (a 53-character release name and
    nameOverride make a 63-character full name): every object's name fits 63 characters, a
    Service's is a DNS-1035 label, and no two objects share a name (each suffix was cut off
    with the whole: the operator's and the metrics Service both took the full name itself);
    every label is valid."""
    from pagoda.operator.kube.names import is_label_key, is_label_value

    values = {**VALUE_SETS["ha-namespaced-tls"], **override}
    files = helm.Chart.load(str(CHART)).render(values, name=release, namespace=NAMESPACE,
                                               is_install=True)  # fmt: skip
    docs = [d for p, t in files.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "duplicate objects"
    assert len({n for k, _, n in names if k == "Service"}) == 2
    for doc in docs:
        meta, where = doc["metadata"], f"{doc['kind']}/{doc['metadata']['name']}"
        assert DNS1123_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 63, where
        if doc["kind"] == "Service":
            assert DNS1035_LABEL.match(meta["name"]), where
        for key, value in (meta.get("labels") or {}).items():
            assert is_label_key(key) and is_label_value(str(value)), (where, key, value)
    assert [e for d in docs for e in validation_errors(d, K8S_VERSIONS[-1])] == []
    short = {(k, n) for k, _, n in (
        (d["kind"], None, d["metadata"]["name"]) for d in render_cached("ha-namespaced-tls"))}  # fmt: skip
    assert ("Service", "pagoda-operator") in short  # short names are as before
    assert ("Role", "pagoda-operator-peering") in short


def test_selectors_never_include_user_labels() -> None:
    for name in VALUE_SETS:
        docs = render_cached(name)
        deployment = one(docs, "Deployment")
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert set(selector) == SELECTOR_KEYS
        assert selector["app.kubernetes.io/component"] == "operator"
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        service_selector = dict(operator_service(docs)["spec"]["selector"])
        if (VALUE_SETS[name].get("operator") or {}).get("replicas", 1) > 1:  # the active one
            assert service_selector.pop("serving.pagoda.dev/peering") == "active"
        assert service_selector == selector
    custom = render_cached("custom-images")
    pod_labels = one(custom, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["team"] == "ml" and pod_labels["cost-center"] == "llm"
    assert all(d["metadata"]["labels"]["cost-center"] == "llm" for d in custom)


def test_user_labels_cannot_override_selector_labels() -> None:
    docs = render(
        {
            "commonLabels": {"app.kubernetes.io/instance": "x"},
            "operator": {"podLabels": {"app.kubernetes.io/component": "y"}},
        }
    )
    deployment = one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/component"] == "operator"


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_operator_pod_is_restricted(value_set: str) -> None:
    """Pod Security Standards `restricted`, read-only root, no service links, probes, resources."""
    deployment = one(render_cached(value_set), "Deployment")
    replicas = (VALUE_SETS[value_set].get("operator") or {}).get("replicas", 1)
    assert deployment["spec"]["replicas"] == replicas
    if replicas == 1:  # standalone kopf: never two at once; peering: test_chart_peering.py
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert (
        pod["serviceAccountName"]
        == one(render_cached(value_set), "ServiceAccount")["metadata"]["name"]
    )
    assert "hostNetwork" not in pod and "hostPID" not in pod
    container = operator_container(render_cached(value_set))
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    if (VALUE_SETS[value_set].get("webhook") or {}).get("tls"):  # test_chart_peering.py
        assert mounts.pop("/etc/pagoda/tls")["readOnly"] is True
    assert set(mounts) == {"/tmp"}
    assert container["livenessProbe"]["httpGet"]["port"] == "http"
    assert container["readinessProbe"]["httpGet"]["port"] == "http"


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_operator_args_are_real_cli_flags(value_set: str) -> None:
    """The Deployment's args parse with `pagoda operator`'s own argparse definition and build a
    valid OperatorConfig that matches the values; the probes and ports match its HTTP server."""
    values: dict[str, Any] = VALUE_SETS[value_set]
    docs = render_cached(value_set)
    container = operator_container(docs)
    assert "command" not in container, "the image's ENTRYPOINT is `pagoda`"
    args = container["args"]
    assert args[0] == "operator"
    parser = argparse.ArgumentParser(prog="pagoda operator", exit_on_error=False)
    operator_main.add_arguments(parser)
    config = operator_main.config_from_args(parser.parse_args(args[1:]))
    assert config.namespaces == tuple(values.get("watchNamespaces", ()))
    allowed = tuple(values.get("prometheus", {}).get("allowedURLs", ()))
    assert config.allowed_prometheus_urls == allowed
    assert config.clusterwide == (not values.get("watchNamespaces"))
    (port,) = container["ports"]
    assert port["name"] == "http" and port["containerPort"] == config.http_port
    assert config.log_format == values.get("operator", {}).get("logFormat", "json")
    service = operator_service(docs)
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == "http" and service_port["name"] == "http"
    routes = {
        (r.method, r.resource.canonical)
        for r in OperatorHttpServer(
            "127.0.0.1", 0, is_alive=bool, is_ready=bool
        ).app.router.routes()
    }
    for probe in ("livenessProbe", "readinessProbe"):
        assert ("GET", container[probe]["httpGet"]["path"]) in routes


def test_images_come_from_values_and_are_pinned() -> None:
    app_version = helm.Chart.load(str(CHART)).metadata["appVersion"]
    default = operator_container(render_cached("defaults"))
    assert default["image"] == f"ghcr.io/pagoda-dev/pagoda-operator:{app_version}"
    assert f"--default-image=ghcr.io/pagoda-dev/pagoda-runtime:{app_version}" in default["args"]
    custom = operator_container(render_cached("custom-images"))
    assert custom["image"] == "registry.example.com/pagoda/operator:1.2.3"
    assert (
        f"--default-image=registry.example.com/pagoda/runtime@sha256:{'ab' * 32}" in custom["args"]
    )
    for name in VALUE_SETS:
        container = operator_container(render_cached(name))
        assert not container["image"].endswith(":latest")
        assert not any(a.endswith(":latest") for a in container["args"])


@pytest.mark.parametrize("image", ["operator", "runtime"])
def test_latest_tag_is_refused_with_a_readable_error(image: str) -> None:
    with pytest.raises(helm.HelmRenderError, match='image tag "latest" is not allowed'):
        render({image: {"image": {"tag": "latest"}}})


def test_prometheus_url_and_webhook_token_reach_the_operator() -> None:
    env = {e["name"]: e for e in operator_container(render_cached("defaults"))["env"]}
    assert "PAGODA_PROMETHEUS_URL" not in env and "PAGODA_WEBHOOK_TOKEN" not in env
    docs = render_cached("monitoring")
    env = {e["name"]: e for e in operator_container(docs)["env"]}
    assert env["PAGODA_PROMETHEUS_URL"]["value"] == "http://prometheus-operated.monitoring.svc:9090"
    secret = one(docs, "Secret")
    ref = env["PAGODA_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "token"}
    assert len(secret["data"]["token"]) >= 40  # base64 of 32 random characters
    custom = {e["name"]: e for e in operator_container(render_cached("custom-images"))["env"]}
    assert custom["PAGODA_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "alert-token",
        "key": "bearer",
    }
    assert not of_kind(render_cached("custom-images"), "Secret")


def test_notes_token_command_reads_a_dotted_key() -> None:
    """The NOTES' jsonpath reads the token whatever the key (a dot must be escaped)."""
    kubectl = require_tool("kubectl")
    values = {"webhook": {"tokenSecret": {"create": True, "key": "bearer.token"}}}
    notes = render_files(values)["pagoda/templates/NOTES.txt"]
    (command,) = re.findall(r"Bearer token: (kubectl .*) \| base64 -d$", notes, re.M)
    (jsonpath,) = [a for a in shlex.split(command) if a.startswith("jsonpath=")]
    out = subprocess.run(
        [
            kubectl,
            "create",
            "secret",
            "generic",
            "t",
            "--from-literal=bearer.token=s3cret",
            "--dry-run=client",
            "-o",
            jsonpath,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert base64.b64decode(out) == b"s3cret"


@pytest.mark.parametrize("service_type", ["NodePort", "LoadBalancer"])
def test_exposed_service_needs_a_webhook_token(service_type: str) -> None:
    """POST /alerts scales InferenceServices up: outside the cluster only with a token."""
    with pytest.raises(helm.HelmRenderError, match=rf"service.type {service_type} exposes .*token"):
        render({"service": {"type": service_type}})
    docs = render({"service": {"type": service_type}, "webhook": {"tokenSecret": {"create": True}}})
    assert operator_service(docs)["spec"]["type"] == service_type


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"operator": {"extraEnv": [{"name": "HOME", "value": "/x"}]}}, "HOME"),
        (
            {
                "prometheus": {"url": "http://prometheus:9090"},
                "operator": {"extraEnv": [{"name": "PAGODA_PROMETHEUS_URL", "value": "http://p"}]},
            },
            "PAGODA_PROMETHEUS_URL",
        ),
        ({"operator": {"extraEnv": [{"name": "A", "value": "1"}, {"name": "A"}]}}, "A"),
    ],
)
def test_extra_env_cannot_repeat_a_name(values: dict[str, Any], name: str) -> None:
    """A duplicate env name: Kubernetes keeps one, and helm upgrade's patch can fail on it."""
    with pytest.raises(helm.HelmRenderError, match=rf"operator.extraEnv: {name} is already set"):
        render(values)
    alone = {"operator": {"extraEnv": [{"name": "PAGODA_PROMETHEUS_URL", "value": "http://p"}]}}
    env = [e["name"] for e in operator_container(render(alone))["env"]]
    assert env.count("PAGODA_PROMETHEUS_URL") == 1


def test_pod_ids_can_be_left_to_the_platform() -> None:
    """OpenShift's restricted SCC assigns the uid: podSecurityContext=null leaves the ids out,
    and the pod stays non-root with the RuntimeDefault profile."""
    docs = render({"operator": {"podSecurityContext": None}})
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert not validation_errors(one(docs, "Deployment"), K8S_VERSIONS[0])
    with pytest.raises(helm.HelmValuesError, match="runAsUser': minimum: got 0, want 1"):
        render({"operator": {"podSecurityContext": {"runAsUser": 0}}})


@pytest.mark.parametrize(
    ("ids", "want"),
    [
        ({}, (1000, 1000, 1000)),
        (None, (None, None, None)),  # OpenShift's restricted SCC assigns them
        ({"runAsUser": None, "fsGroup": 5000}, (None, 1000, 5000)),
    ],
)
def test_runtime_pod_ids_reach_the_operator(ids: dict[str, Any] | None, want: tuple) -> None:
    """runtime.podSecurityContext becomes the operator's --pod-run-as-user/-group/--pod-fs-group
    (the ids of the model-server and tuning pods); a null one is left to the platform."""
    args = operator_container(render({"runtime": {"podSecurityContext": ids}}))["args"]
    parser = argparse.ArgumentParser(prog="pagoda operator", exit_on_error=False)
    operator_main.add_arguments(parser)
    pod_ids = operator_main.config_from_args(parser.parse_args(args[1:])).pod_ids
    assert (pod_ids.run_as_user, pod_ids.run_as_group, pod_ids.fs_group) == want
    with pytest.raises(helm.HelmValuesError, match="runAsUser': minimum: got 0, want 1"):
        render({"runtime": {"podSecurityContext": {"runAsUser": 0}}})


def test_notes_show_how_to_try_it() -> None:
    notes = render_files({})["pagoda/templates/NOTES.txt"]
    for text in (
        "kubectl apply -f examples/smollm2-cpu.yaml",
        "kubectl get isvc smollm2",
        "kubectl port-forward svc/smollm2 8000:8000",
        "curl localhost:8000/v1/chat/completions",
        "kubectl scale isvc/smollm2 --replicas=2",
        f"http://{RELEASE}-operator.{NAMESPACE}.svc:8080/alerts",
    ):
        assert text in notes
    namespaced = render_files(VALUE_SETS["namespaced"])["pagoda/templates/NOTES.txt"]
    assert "team-a, team-b" in namespaced


def test_notes_put_the_example_where_the_operator_watches() -> None:
    """The example pins `namespace: default`; an operator restricted to other namespaces would
    never see it, so NOTES sends it (with a namespace the sed gives it) to a watched one."""
    notes = render_files(VALUE_SETS["namespaced"])["pagoda/templates/NOTES.txt"]
    (sed,) = re.findall(
        r"^ +(sed .*examples/smollm2-cpu\.yaml) \| kubectl apply -f -$", notes, re.M
    )
    old, new = re.fullmatch(r"sed 's/([^/]+)/([^/]+)/' examples/smollm2-cpu\.yaml", sed).groups()
    example = (ROOT / "examples" / "smollm2-cpu.yaml").read_text()
    assert old in example
    (isvc,) = [d for d in yaml.safe_load_all(example.replace(old, new)) if d]
    assert isvc["metadata"]["namespace"] == "team-a"
    assert "kubectl apply -f examples/smollm2-cpu.yaml" not in notes
    for command in ("get isvc smollm2", "port-forward svc/smollm2", "scale isvc/smollm2"):
        assert re.search(rf"kubectl {command} .*-n team-a", notes), command
    watched = render_files({"watchNamespaces": ["llm", "default"]})["pagoda/templates/NOTES.txt"]
    assert "kubectl apply -f examples/smollm2-cpu.yaml" in watched
    assert "kubectl get isvc smollm2 -n default" in watched


@pytest.mark.parametrize(
    "key", ["operatorServiceMonitor", "alertmanagerConfig", "grafanaDashboard", None]
)
def test_notes_name_every_monitoring_object(key: str | None) -> None:
    values = VALUE_SETS["monitoring"] if key is None else {"monitoring": {key: {"enabled": True}}}
    if key == "grafanaDashboard":
        values["monitoring"][key]["namespace"] = "grafana"
    notes = render_files(values)["pagoda/templates/NOTES.txt"]
    objects = [
        d
        for d in render(values)
        if d["apiVersion"].startswith("monitoring.coreos.com/") or d["kind"] == "ConfigMap"
    ]
    assert objects
    for d in objects:
        kind = "Grafana dashboard" if d["kind"] == "ConfigMap" else d["kind"]
        assert re.search(rf"^   - {kind} .*{d['metadata']['name']}", notes, re.M), d["kind"]
        if d["metadata"]["namespace"] != NAMESPACE:
            assert f"{d['metadata']['name']} (namespace {d['metadata']['namespace']})" in notes


def test_notes_name_the_monitoring_objects_of_the_longest_full_name() -> None:
    """With a 63-character full name (release and nameOverride of 53) each object's suffix
    is kept by cutting the full name before it: the NOTES name the objects as rendered."""
    values = {**VALUE_SETS["monitoring"], "nameOverride": "n" * 53}
    files = helm.Chart.load(str(CHART)).render(values, name="r" * 53, namespace=NAMESPACE,
                                               is_install=True)  # fmt: skip
    notes = files["pagoda/templates/NOTES.txt"]
    docs = [d for p, t in files.items() if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
    objects = [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")
               or d["kind"] == "ConfigMap"]  # fmt: skip
    assert len(objects) >= 4
    for d in objects:
        kind = "Grafana dashboard" if d["kind"] == "ConfigMap" else d["kind"]
        name = d["metadata"]["name"]
        assert len(name) <= 63 and re.search(rf"^   - {kind} .*\b{name}\b", notes, re.M), name


def test_rbac_and_service_account_can_be_disabled() -> None:
    docs = render(
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"}}
    )
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Service"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"
    with pytest.raises(helm.HelmRenderError, match=r"serviceAccount\.name is required"):
        render({"serviceAccount": {"create": False}})
