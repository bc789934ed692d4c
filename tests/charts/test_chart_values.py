"""values.yaml and values.schema.json: wrong values fail `helm install` with the offending path,
and every setting in values.yaml is documented by a comment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_helpers import CHART, VALUE_SETS, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())

BAD_VALUES = [
    # (values, path in the error, words in the error)
    (
        {"operator": {"logFormat": "xml"}},
        "/operator/logFormat",
        "must be one of 'plain', 'full', 'json'",
    ),
    ({"replicaCount": 2}, "at ''", "additional properties 'replicaCount' not allowed"),
    ({"operator": {"imagee": {}}}, "/operator", "additional properties 'imagee' not allowed"),
    ({"operator": {"httpPort": "8080"}}, "/operator/httpPort", "got string, want integer"),
    ({"operator": {"image": {"tag": 1.2}}}, "/operator/image/tag", "got number, want string"),
    ({"watchNamespaces": "team-a"}, "/watchNamespaces", "got string, want array"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0", "'Team_A' does not match pattern"),
    ({"watchNamespaces": ["a", "a"]}, "/watchNamespaces", "items at 0 and 1 are equal"),
    (
        {"monitoring": {"prometheusRule": {"alerts": {"kvCacheSaturated": {"threshold": 1.5}}}}},
        "/monitoring/prometheusRule/alerts/kvCacheSaturated/threshold",
        "maximum: got 1.5, want 1",
    ),
    (
        {"monitoring": {"prometheusRule": {"alerts": {"ttftHigh": {"for": "5 minutes"}}}}},
        "/monitoring/prometheusRule/alerts/ttftHigh/for",
        "does not match pattern",
    ),
    ({"prometheus": {"url": "prometheus:9090"}}, "/prometheus/url", "does not match pattern"),
    ({"service": {"port": 0}}, "/service/port", "minimum: got 0, want 1"),
    # uid 1000 without NET_BIND_SERVICE cannot bind it (containerd < 2 keeps ports < 1024 privileged)
    ({"operator": {"httpPort": 80}}, "/operator/httpPort", "minimum: got 80, want 1,024"),
    # EnvVar and Toleration fields the API server would refuse later, less readably
    (
        {"operator": {"extraEnv": [{"name": "X", "value": 1}]}},
        "/operator/extraEnv/0/value",
        "got number, want string",
    ),
    (
        {"operator": {"extraEnv": [{"name": "X", "valeu": "1"}]}},
        "/operator/extraEnv/0",
        "additional properties 'valeu' not allowed",
    ),
    (
        {"operator": {"tolerations": [{"key": "gpu", "tolerationSeconds": "60"}]}},
        "/operator/tolerations/0/tolerationSeconds",
        "got string, want integer",
    ),
    (
        {"operator": {"tolerations": [{"key": "gpu", "operator": "exists"}]}},
        "/operator/tolerations/0/operator",
        "must be one of 'Exists', 'Equal'",
    ),
    # the operator sets these on its ServiceMonitors (its watch selects by managed-by)
    (
        {"monitoring": {"labels": {"app.kubernetes.io/managed-by": "x"}}},
        "/monitoring/labels",
        "invalid propertyName 'app.kubernetes.io/managed-by'",
    ),
    (
        {"monitoring": {"runtimeServiceMonitor": {"enabled": "yes"}}},
        "/monitoring/runtimeServiceMonitor/enabled",
        "got string, want boolean",
    ),
]


@pytest.mark.parametrize(("values", "path", "words"), BAD_VALUES, ids=[b[1] for b in BAD_VALUES])
def test_schema_rejects_bad_values_readably(values: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    message = str(err.value)
    assert path in message and words in message, message
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(chart.merge_values(values))


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_value_sets_and_defaults_pass_the_schema(value_set: str) -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(chart.merge_values(VALUE_SETS[value_set]))


def _strict_paths(
    schema: dict[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], bool]]:
    """(path, is_setting) for every property the schema pins down; a setting is a leaf or a
    free-form object (labels, resources, probes); strict objects are just containers."""
    if "$ref" in schema:
        schema = SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]]
    for key, sub in schema.get("properties", {}).items():
        if "$ref" in sub:
            sub = SCHEMA["definitions"][sub["$ref"].rsplit("/", 1)[1]]
        container = sub.get("type") == "object" and sub.get("additionalProperties") is False
        yield (*prefix, key), not container
        if container:
            yield from _strict_paths(sub, (*prefix, key))


def _key_lines() -> dict[tuple[str, ...], int]:
    """Line number (0-based) of every mapping key in values.yaml, by path."""
    root = yaml.compose((CHART / "values.yaml").read_text())
    out: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = (*prefix, key.value)
                out[path] = key.start_mark.line
                walk(value, path)

    walk(root, ())
    return out


def test_every_setting_in_values_yaml_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    where = _key_lines()
    undocumented = []
    for path, is_setting in _strict_paths(SCHEMA):
        if path == ("global",):
            continue  # Helm's, for parent charts
        assert path in where, f"{'.'.join(path)} is in the schema but not in values.yaml"
        if is_setting and not lines[where[path] - 1].lstrip().startswith("#"):
            undocumented.append(".".join(path))
    assert undocumented == []


def test_schema_is_strict_at_the_top_and_typed_everywhere() -> None:
    assert SCHEMA["additionalProperties"] is False
    for path, _ in _strict_paths(SCHEMA):
        node: dict[str, Any] = SCHEMA
        for key in path:
            node = node["properties"][key]
            if "$ref" in node:
                node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
        assert "type" in node or "enum" in node, f"{'.'.join(path)} has no type"


@pytest.mark.parametrize(
    ("monitor", "interval", "timeout", "ok"),
    [
        ("runtimeServiceMonitor", "5s", "10s", False),
        ("operatorServiceMonitor", "1m", "61s", False),
        ("operatorServiceMonitor", "1m30s", "90s", True),
        ("runtimeServiceMonitor", "1s", "500ms", True),
        ("runtimeServiceMonitor", "1s", "1001ms", False),
        ("operatorServiceMonitor", "1h", "59m", True),
    ],
)
def test_scrape_timeout_must_not_exceed_the_interval(
    monitor: str, interval: str, timeout: str, ok: bool
) -> None:
    """Prometheus refuses a scrape whose timeout exceeds its interval (the Prometheus Operator
    then drops the ServiceMonitor and nothing is scraped): `helm install` says so instead."""
    values = {
        "monitoring": {monitor: {"enabled": True, "interval": interval, "scrapeTimeout": timeout}}
    }
    if ok:
        render(values)
        return
    with pytest.raises(helm.HelmRenderError) as err:
        render(values)
    assert f"monitoring.{monitor}.scrapeTimeout ({timeout}) must not exceed" in str(err.value)


@pytest.mark.parametrize("key", ["commonLabels", "operator.podLabels", "monitoring.labels"])
@pytest.mark.parametrize("labels", [{"bad key!": "x"}, {"team": "a b"}, {"team": "x" * 64}])
def test_label_values_are_kubernetes_labels(key: str, labels: dict[str, str]) -> None:
    """A label the API server refuses would fail every object at install: the schema refuses it."""
    values: dict[str, Any] = labels
    for part in reversed(key.split(".")):
        values = {part: values}
    with pytest.raises(helm.HelmValuesError) as err:
        render(values)
    assert "does not match pattern" in str(err.value) or "maxLength" in str(err.value), err.value
    good = {"app.kubernetes.io/team": "ml-platform", "cost-center": ""}
    values = good
    for part in reversed(key.split(".")):
        values = {part: values}
    render(values)
