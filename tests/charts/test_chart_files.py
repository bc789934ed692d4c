"""Chart files that must stay in step with the rest of the repository: the CRD copy, chart
metadata vs. the package and the operator's defaults, and the README's deploy section."""

from __future__ import annotations

import os
import re

import helm_python as helm
import pytest
import yaml
from chart_helpers import (
    CHART,
    K8S_VERSIONS,
    ROOT,
    operator_container,
    render_cached,
    validation_errors,
)
from pagoda.operator.spec import config

README = (ROOT / "README.md").read_text()
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def test_chart_crds_are_a_byte_identical_copy_of_crds() -> None:
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copy = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, "no CRDs in crds/"
    assert sorted(copy) == sorted(source), "run charts/sync-crds.sh"
    for name in source:
        assert copy[name] == source[name], (
            f"charts/pagoda/crds/{name} differs: run charts/sync-crds.sh"
        )


def test_sync_script_is_executable() -> None:
    script = ROOT / "charts" / "sync-crds.sh"
    assert os.access(script, os.X_OK)
    assert "crds/" in script.read_text()


def test_helm_sees_the_crd() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        docs = [d for crd in chart.crds for d in yaml.safe_load_all(crd["data"]) if d]
        names = sorted(d["metadata"]["name"] for d in docs)
        assert names == [
            "clusterkopfpeerings.kopf.dev",  # kopf peering (operator.replicas > 1)
            "inferenceservices.serving.pagoda.dev",
            "kopfpeerings.kopf.dev",
        ]
        for doc in docs:
            assert [e for v in K8S_VERSIONS for e in validation_errors(doc, v)] == []
        meta = chart.metadata
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["appVersion"] == pyproject["project"]["version"]
    assert meta["apiVersion"] == "v2" and meta["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])


def test_default_runtime_image_matches_the_operators_own_default() -> None:
    args = operator_container(render_cached("defaults"))["args"]
    assert f"--default-image={config.DEFAULT_IMAGE}" in args


def _deploy_section() -> str:
    m = re.search(r"<!-- deploy:start -->(.*)<!-- deploy:end -->", README, re.S)
    assert m, "README.md lost its deploy markers"
    return m[1]


def test_readme_deploy_section() -> None:
    section = _deploy_section()
    assert "## Deploy on Kubernetes" in section
    for text in (
        "Prerequisites",
        "helm install pagoda charts/pagoda",
        "kubectl apply -f examples/smollm2-cpu.yaml",
        "kubectl get isvc",
        "kubectl scale isvc/",
        "--replicas=",
        "autoscaling",
        "kubectl port-forward svc/smollm2 8000:8000",
        "grafana_dashboard",
        "make image",
    ):
        assert text in section, text


def test_readme_values_table_matches_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rows = re.findall(r"^\| `([\w.]+)` \| (.+?) \| .+ \|$", _deploy_section(), re.M)
    assert len(rows) >= 20
    for key, default in rows:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key} is not in values.yaml"
            node = node[part]
        if default.startswith("`") and default.endswith("`"):
            literal = default.strip("`")
            assert yaml.safe_load(literal if literal != '""' else "''") == node, key
