"""A pod's containers that stopped with a parsable termination message → why the service fails.

`pagoda serve` and `pagoda download` leave `Reason[/Detail]: message` in their container's
termination-message file on a bad-input exit (runtime/termination.py); the kubelet copies it into
the pod's status. This reads it back from any container, init or not, so a failure the runtime
can name (ModelDownloadFailed, InvalidArguments, ModelDoesNotFit, ...) becomes the reason of the
InferenceService's conditions instead of a pod crash-looping without a word.

A container the kubelet cannot even start is named the same way, with the kubelet's own reason
and message: `CreateContainerConfigError` (e.g. `secret "hf-token" not found`: a
spec.modelSecretRef or apiKeySecretRef naming a Secret that is not there, or a key missing from
it), `ErrImagePull` / `ImagePullBackOff` / `InvalidImageName` (spec.image). Otherwise such a pod
waits forever and the service only says it is progressing. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.runtime.termination import parse

# waiting reasons that do not pass by themselves (not ContainerCreating, PodInitializing, ...)
STUCK = ("CreateContainerConfigError", "CreateContainerError", "ErrImagePull",
         "ImagePullBackOff", "InvalidImageName")  # fmt: skip


@dataclass(frozen=True)
class PodFailure:
    reason: str  # CamelCase: the condition's reason
    message: str  # "<Detail>: <message>" when the runtime named a detail
    pod: str
    container: str  # "init container model-download", "container server"

    @property
    def description(self) -> str:
        return f"{self.message} (pod {self.pod}, {self.container})"


def _failed(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The `terminated` state of a container that failed and has not come back since."""
    state = status.get("state") or {}
    if "running" in state:
        return None
    terminated = state.get("terminated")
    if terminated is None and "waiting" in state:  # CrashLoopBackOff: the last run's end
        terminated = (status.get("lastState") or {}).get("terminated")
    if not terminated or not terminated.get("exitCode"):
        return None
    return terminated


def pod_failure(pod: Mapping[str, Any]) -> PodFailure | None:
    """The first container of `pod` (init containers first) that failed with a parsable
    termination message, or None."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    for kind, key in (
        ("init container", "initContainerStatuses"),
        ("container", "containerStatuses"),
    ):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK:
                said = " ".join(str(waiting.get("message") or waiting["reason"]).split())
                return PodFailure(
                    waiting["reason"], said[:1024], meta.get("name", ""), f"{kind} {cs.get('name')}"
                )
            terminated = _failed(cs)
            parsed = parse((terminated or {}).get("message"))
            if parsed is None:
                continue
            message = f"{parsed.detail}: {parsed.message}" if parsed.detail else parsed.message
            return PodFailure(
                parsed.reason, message, meta.get("name", ""), f"{kind} {cs.get('name')}"
            )
    return None
