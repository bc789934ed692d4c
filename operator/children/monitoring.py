"""The monitoring.coreos.com children: the ServiceMonitor that scrapes the pods, and the
PrometheusRule with this service's alerts and TTFT alert threshold (autoscaling/rules.py), both with the operator's
`--monitoring-label`s (a Prometheus selects them by label, e.g. `release`). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling import rules
from pagoda.operator.children.owner import adopt, child
from pagoda.operator.kube.names import LABEL_INSTANCE, selector_labels
from pagoda.runtime import options

if TYPE_CHECKING:
    from pagoda.operator.children.owner import Owner
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

Labels = Sequence[tuple[str, str]]  # extra (key, value) labels: OperatorConfig.monitoring_labels


def _prom_name(label: str) -> str:
    """A Kubernetes label as Prometheus' service discovery names it (non-alphanumerics → _)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def _relabel(source: str, target: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [source], "targetLabel": target}


def _add_labels(obj: dict[str, Any], labels: Labels) -> dict[str, Any]:
    """The operator's `--monitoring-label`s, before `adopt` (so the owner's labels never replace
    them); the standard labels stay (OperatorConfig refuses those keys)."""
    meta = obj["metadata"]
    meta["labels"] = {**dict(labels), **meta["labels"]}
    return obj


def build_service_monitor(owner: Owner, labels: Labels = ()) -> dict[str, Any]:
    obj = _add_labels(
        child(owner, "ServiceMonitor", "monitoring.coreos.com/v1", owner.name), labels
    )
    obj["spec"] = {
        "selector": {"matchLabels": selector_labels(owner.name)},
        "endpoints": [
            {
                "port": "http",
                "path": options.METRICS_PATH,
                "interval": "5s",  # the autoscaler's 15 s arrival rate needs 3 samples
                # the same target labels as the chart's runtime ServiceMonitor (alerts group by them)
                "relabelings": [
                    _relabel("__meta_kubernetes_namespace", "namespace"),
                    _relabel(
                        f"__meta_kubernetes_pod_label_{_prom_name(LABEL_INSTANCE)}",
                        "inferenceservice",
                    ),
                    _relabel("__meta_kubernetes_pod_name", "pod"),
                ],
            }
        ],
    }
    return adopt(obj, owner)


def build_prometheus_rule(
    owner: Owner, spec: InferenceServiceSpec, labels: Labels = (), *, alerts: bool = True
) -> dict[str, Any] | None:
    """This service's alerts and TTFT alert threshold (rules.py), so Alertmanager can ask
    POST /alerts for a step; `alerts` False: the threshold only (the chart's PrometheusRule
    evaluates the alerts). None: nothing to evaluate."""
    groups = rules.service_rules(owner.namespace, owner.name, spec, alerts=alerts)
    if groups is None:
        return None
    name = rules.rule_name(owner.name)
    obj = _add_labels(child(owner, "PrometheusRule", "monitoring.coreos.com/v1", name), labels)
    obj["spec"] = groups
    return adopt(obj, owner)
