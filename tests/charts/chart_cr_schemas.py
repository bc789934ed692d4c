"""Trimmed, strict JSON schemas of the Prometheus Operator custom resources the chart renders.

kubernetes-validate only warns on custom resources, so these carry the parts of the upstream
CRDs (prometheus-operator `example/prometheus-operator-crd/`, v0.8x) the chart uses, with the
same field names, types, enums and patterns, and `additionalProperties: false` so a misspelt
or misplaced field fails instead of being pruned silently by the API server.
"""

from __future__ import annotations

from typing import Any

DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
LABEL_NAME = "^[a-zA-Z_][a-zA-Z0-9_]*$"
DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        out["required"] = list(required)
    return out


_STR = {"type": "string"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _obj(
    {
        "name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
        "namespace": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
    },
    ("name", "namespace"),
)
_SECRET_KEY = _obj({"name": _STR, "key": _STR, "optional": {"type": "boolean"}}, ("key",))
# SafeTLSConfig: the operator's own certificate, verified with the CA of its Secret
_SAFE_TLS = _obj(
    {
        "ca": _obj({"secret": _SECRET_KEY, "configMap": _SECRET_KEY}),
        "serverName": _STR,
        "insecureSkipVerify": {"type": "boolean"},
    }
)
_LABEL_SELECTOR = _obj(
    {
        "matchLabels": _STR_MAP,
        "matchExpressions": {
            "type": "array",
            "items": _obj(
                {"key": _STR, "operator": _STR, "values": {"type": "array", "items": _STR}},
                ("key", "operator"),
            ),
        },
    }
)
_RELABEL = _obj(
    {
        "action": {
            "type": "string",
            "enum": [
                *("replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod"),
                *("labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep"),
                *("lowercase", "Lowercase", "uppercase", "Uppercase"),
                *("keepequal", "KeepEqual", "dropequal", "DropEqual"),
            ],
        },
        "modulus": {"type": "integer"},
        "regex": _STR,
        "replacement": _STR,
        "separator": _STR,
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": LABEL_NAME}},
        "targetLabel": _STR,
    }
)
_ENDPOINT = _obj(
    {
        "port": _STR,
        "targetPort": {"type": ["string", "integer"]},
        "path": _STR,
        "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": DURATION},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"},
        "relabelings": {"type": "array", "items": _RELABEL},
        "metricRelabelings": {"type": "array", "items": _RELABEL},
        "authorization": _obj({"type": _STR, "credentials": _SECRET_KEY}),
        "tlsConfig": _SAFE_TLS,
    }
)
SERVICE_MONITOR = _obj(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": _obj(
            {
                "jobLabel": _STR,
                "targetLabels": {"type": "array", "items": _STR},
                "podTargetLabels": {"type": "array", "items": _STR},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": _obj(
                    {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": _STR}}
                ),
                "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
            },
            ("selector", "endpoints"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
_RULE = _obj(
    {
        "alert": _STR,
        "record": _STR,
        "expr": {"type": ["string", "integer"]},
        "for": {"type": "string", "pattern": DURATION},
        "keep_firing_for": {"type": "string", "pattern": DURATION},
        "labels": _STR_MAP,
        "annotations": _STR_MAP,
    },
    ("expr",),
)
PROMETHEUS_RULE = _obj(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": _obj(
            {
                "groups": {
                    "type": "array",
                    "items": _obj(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "limit": {"type": "integer"},
                            "labels": _STR_MAP,
                            "rules": {"type": "array", "items": _RULE},
                        },
                        ("name",),
                    ),
                }
            }
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
_MATCHER = _obj(
    {
        "name": {"type": "string", "minLength": 1},
        "value": _STR,
        "matchType": {"type": "string", "enum": ["!=", "=", "=~", "!~"]},
        "regex": {"type": "boolean"},
    },
    ("name",),
)
_ROUTE = _obj(
    {
        "receiver": _STR,
        "groupBy": {"type": "array", "items": _STR},
        "groupWait": _STR,
        "groupInterval": _STR,
        "repeatInterval": _STR,
        "matchers": {"type": "array", "items": _MATCHER},
        "continue": {"type": "boolean"},
    }
)
_WEBHOOK = _obj(
    {
        "url": {"type": "string", "pattern": "^https?://.+$"},
        "urlSecret": _SECRET_KEY,
        "sendResolved": {"type": "boolean"},
        "maxAlerts": {"type": "integer", "minimum": 0},
        "timeout": {"type": "string", "pattern": DURATION},
        "httpConfig": _obj(
            {
                "authorization": _obj({"type": _STR, "credentials": _SECRET_KEY}),
                "tlsConfig": _SAFE_TLS,
            }
        ),
    }
)
ALERTMANAGER_CONFIG = _obj(
    {
        "apiVersion": {"const": "monitoring.coreos.com/v1alpha1"},
        "kind": {"const": "AlertmanagerConfig"},
        "metadata": _METADATA,
        "spec": _obj(
            {
                "route": _ROUTE,
                "receivers": {
                    "type": "array",
                    "items": _obj(
                        {
                            "name": {"type": "string", "minLength": 1},
                            "webhookConfigs": {"type": "array", "items": _WEBHOOK},
                        },
                        ("name",),
                    ),
                },
            }
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)


def _kopf_peering(kind: str, namespaced: bool) -> dict[str, Any]:
    """kopf's peering objects (crds/kopf-peering.yaml): metadata and a free-form status."""
    fields = dict(_METADATA["properties"])
    if not namespaced:
        del fields["namespace"]  # cluster-scoped: a namespace is an error
    meta = _obj(fields, ("name", "namespace") if namespaced else ("name",))
    return _obj(
        {
            "apiVersion": {"const": "kopf.dev/v1"},
            "kind": {"const": kind},
            "metadata": meta,
            "status": {"type": "object"},
        },
        ("apiVersion", "kind", "metadata"),
    )


CR_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("kopf.dev/v1", "ClusterKopfPeering"): _kopf_peering("ClusterKopfPeering", namespaced=False),
    ("kopf.dev/v1", "KopfPeering"): _kopf_peering("KopfPeering", namespaced=True),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): ALERTMANAGER_CONFIG,
}
