"""The serving pods' named failures, as the pod watch reports them (handlers.py): a registry
of the failing pods of each InferenceService, rebuilt from the watch after a restart (kopf lists
the pods first), and what a change of it means for the owner's status.

Kept in memory, not in the API: it is an input of the status like the Deployment is, and every
status writer (reconcile, child events, resync, pod events) reads the same registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.operator.kube.names import LABEL_INSTANCE
from pagoda.operator.spec.pod_failure import PodFailure, pod_failure

Key = tuple[str, str]  # (namespace, InferenceService name)


class PodFailures:
    def __init__(self) -> None:
        self._failing: dict[Key, dict[str, PodFailure]] = {}

    @staticmethod
    def key(pod: Mapping[str, Any]) -> Key | None:
        meta = pod.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(LABEL_INSTANCE)
        return (meta.get("namespace") or "", owner) if owner else None

    def observe(
        self, event_type: str | None, pod: Mapping[str, Any]
    ) -> tuple[bool, PodFailure | None]:
        """Record a pod's event: (whether its owner's failure changed, the pod's failure if it
        is new, i.e. worth an Event)."""
        key = self.key(pod)
        if key is None:
            return False, None
        name = (pod.get("metadata") or {}).get("name", "")
        failure = None if event_type == "DELETED" else pod_failure(pod)
        pods = self._failing.setdefault(key, {})
        before = self.failure(*key)
        previous = pods.pop(name, None)
        if failure is not None:
            pods[name] = failure
        if not pods:
            del self._failing[key]
        changed = self.failure(*key) != before
        return changed, failure if failure is not None and failure != previous else None

    def failure(self, namespace: str, name: str) -> PodFailure | None:
        """The failure the status shows: the first failing pod by name (stable across events)."""
        pods = self._failing.get((namespace, name)) or {}
        return pods[min(pods)] if pods else None
