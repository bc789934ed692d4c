"""Operator settings: one frozen dataclass, validated on construction, built from CLI args/env."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from pagoda.operator.kube.names import (
    SERVER_PORT,
    PodIds,
    is_label_key,
    is_label_value,
    standard_labels,
)
from pagoda.operator.spec.fields import base_url_problem

DEFAULT_IMAGE = "ghcr.io/pagoda-dev/pagoda-runtime:0.1.0"
LOG_FORMATS = ("plain", "full", "json")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_PEERING_NAME = re.compile(r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")
_PROM_DURATION = re.compile(r"^([0-9]+(ms|s|m|h))+$")
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")


def _redacted(url: str) -> str:
    """`url` without a user and password (a Prometheus behind basic auth)."""
    return _USERINFO.sub(r"\1", url)


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator runs. Empty `namespaces` means cluster-wide."""

    namespaces: tuple[str, ...] = ()
    default_image: str = DEFAULT_IMAGE
    http_host: str = "0.0.0.0"
    http_port: int | None = 8080  # liveness/readiness endpoint; None disables it
    watch_timeout_s: float = 300.0  # server-side timeout of one watch request
    request_timeout_s: float = 30.0  # one API request (non-watch)
    connect_timeout_s: float = 10.0
    resync_interval_s: float = 300.0  # periodic re-reconcile (heals drift the watches missed)
    cluster_domain: str = "cluster.local"
    log_format: str = "plain"
    verbose: bool = False
    debug: bool = False
    peering: str | None = None  # kopf peering object name; None runs standalone
    # Several replicas (kube/peering.py): None picks an earlier-start-is-higher priority.
    peering_priority: int | None = None
    # A replica that died unannounced is gone after this (kopf keeps its record alive every
    # lifetime − 5..10 s, at least 1 s: 15 → every 5..10 s); Kubernetes' own leader election
    # uses a 15 s lease renewed every 2 s.
    peering_lifetime_s: int = 15
    peering_interval_s: float = 2.0  # how often the gate reads the peering records
    pod_name: str | None = None  # env POD_NAME: the peering identity, the pod to label
    pod_namespace: str | None = None  # env POD_NAMESPACE
    # TLS on the HTTP port (POST /alerts, /metrics, probes): PEM files, both or neither.
    http_tls_cert: str | None = None
    http_tls_key: str | None = None
    component_name: str = "pagoda-operator"
    # Autoscaling (autoscaling/): where the metrics are and how often to look.
    prometheus_url: str | None = None  # per-CR spec.autoscaling.prometheusURL overrides it
    # The base URLs a spec.autoscaling.prometheusURL may lie under (prometheus_url_prefixes):
    # whoever may create an InferenceService must not make the operator GET any URL.
    allowed_prometheus_urls: tuple[str, ...] = ()
    prometheus_timeout_s: float = 5.0
    autoscale_interval_s: float = 5.0  # the burst floor reads 15 s rates: keep it at 5 s
    ttft_window: str = "1m"  # PromQL range of the TTFT rate()
    metrics_max_age_s: float = 60.0  # older newest sample = stale metrics
    webhook_token: str | None = field(default=None, repr=False)  # POST /alerts bearer token
    alert_cooldown_s: float = 30.0  # one alert-driven step per service per cooldown
    api_unready_after_s: float = 60.0  # /readyz is 503 once the API server failed this long
    # Autotuning (autotune/): tuning Jobs per GPU product, for services with spec.autotune.
    autotune: bool = True
    autotune_interval_s: float = 15.0
    autotune_retry_base_s: float = 300.0  # a failed Job is retried after base × 2^(attempts−1)
    # a GPU product label that blinks (node relabel, NFD restart) counts after this long
    autotune_product_grace_s: float = 300.0
    # hf:// branches and tags pinned to a commit once (reconcile/model_pin.py)
    pin_models: bool = True
    hub_timeout_s: float = 10.0  # one request to the Hub
    # Per-service monitoring.coreos.com children (children/monitoring.py), built when the
    # Prometheus Operator's CRDs exist. Off: the chart's runtime ServiceMonitor / PrometheusRule
    # own that concern, and the operator deletes the ones it made (one scrape, one rule per alert).
    service_monitors: bool = True
    prometheus_rules: bool = True
    # The uid/gid/fsGroup of the pods it creates (None: left to the platform, e.g. OpenShift)
    pod_ids: PodIds = field(default_factory=PodIds)
    # Extra labels on every ServiceMonitor and PrometheusRule the operator makes, e.g.
    # (("release", "kube-prometheus-stack"),) so that Prometheus selects them.
    monitoring_labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for ns in self.namespaces:
            if not _NAMESPACE.match(ns) or len(ns) > 63:
                raise ValueError(f"invalid namespace {ns!r}")
        if len(set(self.namespaces)) != len(self.namespaces):
            raise ValueError("namespaces must be unique")
        if not self.default_image or any(c.isspace() for c in self.default_image):
            raise ValueError(f"invalid default image {self.default_image!r}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"http_port must be in 0..65535, got {self.http_port}")
        for name in (
            "watch_timeout_s",
            "request_timeout_s",
            "connect_timeout_s",
            "resync_interval_s",
            "prometheus_timeout_s",
            "autoscale_interval_s",
            "metrics_max_age_s",
            "api_unready_after_s",
            "autotune_interval_s",
            "autotune_retry_base_s",
            "autotune_product_grace_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log_format must be one of {LOG_FORMATS}, got {self.log_format!r}")
        if not self.cluster_domain or "/" in self.cluster_domain:
            raise ValueError(f"invalid cluster domain {self.cluster_domain!r}")
        if self.prometheus_url is not None and (
            why := base_url_problem(self.prometheus_url, credentials=True)
        ):
            raise ValueError(f"prometheus_url {why}, got {_redacted(self.prometheus_url)!r}")
        for url in self.allowed_prometheus_urls:
            if why := base_url_problem(url, credentials=False):
                raise ValueError(f"allowed Prometheus URL {why}, got {_redacted(url)!r}")
        if not _PROM_DURATION.match(self.ttft_window):
            raise ValueError(
                f"ttft_window must be a PromQL duration like 1m, got {self.ttft_window!r}"
            )
        if self.alert_cooldown_s < 0:
            raise ValueError(f"alert_cooldown_s must be >= 0, got {self.alert_cooldown_s}")
        if self.webhook_token is not None and (
            not self.webhook_token or any(c.isspace() for c in self.webhook_token)
        ):
            raise ValueError("webhook token must be non-empty and without whitespace")

        if self.peering is not None and not _PEERING_NAME.match(self.peering):
            raise ValueError(f"peering must be a Kubernetes object name, got {self.peering!r}")
        if not 2 <= self.peering_lifetime_s <= 3600:
            raise ValueError(
                f"peering_lifetime_s must be in 2..3600, got {self.peering_lifetime_s}"
            )
        if self.peering_interval_s <= 0:
            raise ValueError(f"peering_interval_s must be positive, got {self.peering_interval_s}")
        if (self.http_tls_cert is None) != (self.http_tls_key is None):
            raise ValueError("a TLS certificate needs its key and a key its certificate")
        _check_monitoring_labels(self.monitoring_labels)

    @property
    def prometheus_url_prefixes(self) -> tuple[str, ...] | None:
        """The base URLs a spec.autoscaling.prometheusURL must lie under: the allowed ones, else
        the operator's own Prometheus; None (any) only when neither is set."""
        if self.allowed_prometheus_urls:
            return self.allowed_prometheus_urls
        if self.prometheus_url:
            return (self.prometheus_url,)
        return None

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    def service_url(self, name: str, namespace: str) -> str:
        """OpenAI base URL of an InferenceService inside the cluster."""
        return f"http://{name}.{namespace}.svc.{self.cluster_domain}:{SERVER_PORT}/v1"

    @classmethod
    def from_env(cls, **overrides: object) -> OperatorConfig:
        """Defaults overridable by env (PAGODA_OPERATOR_NAMESPACES, PAGODA_DEFAULT_IMAGE,
        PAGODA_CLUSTER_DOMAIN, PAGODA_PROMETHEUS_URL, PAGODA_ALLOWED_PROMETHEUS_URLS (comma-separated),
        PAGODA_WEBHOOK_TOKEN, POD_NAME,
        POD_NAMESPACE), then by `overrides`."""
        env: dict[str, object] = {}
        if os.environ.get("PAGODA_DEFAULT_IMAGE"):
            env["default_image"] = os.environ["PAGODA_DEFAULT_IMAGE"]
        if os.environ.get("PAGODA_OPERATOR_NAMESPACES"):
            env["namespaces"] = tuple(
                n for n in os.environ["PAGODA_OPERATOR_NAMESPACES"].split(",") if n
            )
        if os.environ.get("PAGODA_CLUSTER_DOMAIN"):
            env["cluster_domain"] = os.environ["PAGODA_CLUSTER_DOMAIN"]
        if os.environ.get("PAGODA_PROMETHEUS_URL"):
            env["prometheus_url"] = os.environ["PAGODA_PROMETHEUS_URL"]
        if os.environ.get("PAGODA_ALLOWED_PROMETHEUS_URLS", "").strip():
            env["allowed_prometheus_urls"] = tuple(
                u.strip()
                for u in os.environ["PAGODA_ALLOWED_PROMETHEUS_URLS"].split(",")
                if u.strip()
            )
        for var, key in (("POD_NAME", "pod_name"), ("POD_NAMESPACE", "pod_namespace")):
            if os.environ.get(var):
                env[key] = os.environ[var]
        if os.environ.get("PAGODA_WEBHOOK_TOKEN", "").strip():
            env["webhook_token"] = os.environ["PAGODA_WEBHOOK_TOKEN"].strip()
        env.update(overrides)
        return cls(**env)  # type: ignore[arg-type]


def _check_monitoring_labels(labels: tuple[tuple[str, str], ...]) -> None:
    """Kubernetes label syntax; not one of the standard labels (the watch selects children by
    them); each key once."""
    reserved = standard_labels("x").keys()
    seen: set[str] = set()
    for key, value in labels:
        if not is_label_key(key):
            raise ValueError(f"monitoring label key {key!r} is not a Kubernetes label key")
        if not is_label_value(value):
            raise ValueError(
                f"monitoring label {key}={value!r}: not a label value (at most 63 letters, "
                "digits, '-', '_', '.', starting and ending alphanumeric)"
            )
        if key in reserved:
            raise ValueError(f"monitoring label {key!r} is one the operator sets itself")
        if key in seen:
            raise ValueError(f"monitoring label {key!r} given twice")
        seen.add(key)
