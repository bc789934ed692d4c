"""The serving pods' named failures, as the pod watch reports them (handlers.py): a registry
of the failing pods of each InferenceService, rebuilt from the watch after a restart (kopf lists
the pods first), and what a change of it means for the owner's status.

Kept in memory, not in the API: it is an input of the status like the Deployment is, and every
status writer (reconcile, child events, resync, pod events) reads the same registry.

A multi-node group's pods (`serving.pagoda.dev/role`) do not crash-loop in place: LWS's
`RecreateGroupOnPodRestart` deletes the whole group as soon as one rank's container restarts,
and recreates it under the same pod names. Their failure therefore outlives the pod: it stays
(`_departed`) until the pod of the same name comes back Ready or fails again, or a new
generation of the spec is reconciled (`forget_departed`); otherwise a rank that cannot load the
model (ModelDoesNotFit) would show for seconds, then "Unavailable" through each reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pagoda.operator.kube.names import LABEL_INSTANCE, LABEL_ROLE
from pagoda.operator.spec.pod_failure import PodFailure, pod_failure

Key = tuple[str, str]  # (namespace, InferenceService name)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class PodFailures:
    def __init__(self) -> None:
        self._failing: dict[Key, dict[str, PodFailure]] = {}
        self._departed: dict[Key, dict[str, PodFailure]] = {}  # deleted group pods' failures

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
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        gone = event_type == "DELETED" or bool(meta.get("deletionTimestamp"))
        failure = None if event_type == "DELETED" else pod_failure(pod)
        before = self.failure(*key)
        pods = self._failing.setdefault(key, {})
        departed = self._departed.setdefault(key, {})
        previous = pods.pop(name, None)
        if gone and previous is not None and LABEL_ROLE in (meta.get("labels") or {}):
            departed[name] = previous  # its group is being recreated: the failure stays
        elif failure is not None or _ready(pod):
            previous = departed.pop(name, None) or previous
        if failure is not None:
            pods[name] = failure
        self._prune(key)
        changed = self.failure(*key) != before
        return changed, failure if failure is not None and failure != previous else None

    def forget_departed(self, namespace: str, name: str) -> bool:
        """A new generation of the spec: deleted pods' failures no longer describe it. True if
        the failure shown changed."""
        before = self.failure(namespace, name)
        self._departed.pop((namespace, name), None)
        return self.failure(namespace, name) != before

    def _prune(self, key: Key) -> None:
        for registry in (self._failing, self._departed):
            if not registry.get(key):
                registry.pop(key, None)

    def failure(self, namespace: str, name: str) -> PodFailure | None:
        """The failure the status shows: the first failing pod by name (stable across events)."""
        key = (namespace, name)
        pods = {**(self._departed.get(key) or {}), **(self._failing.get(key) or {})}
        return pods[min(pods)] if pods else None
