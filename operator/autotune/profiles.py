"""The tuned-profile ConfigMap: shared by every service with the same key, never owned by one.

The operator pre-creates it empty (labels + the key in annotations); the tuning Job fills `data`
with the files of the profile folder (`pagoda.runtime.tuned_profile`: `profile.json` and the kernel
configs, whose names are valid keys). Retry bookkeeping lives in its annotations, so a restarted operator, or a Job
deleted by hand, cannot turn into a tight retry loop. Pure.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.names import (
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    MANAGED_BY,
)
from pagoda.runtime.tuned_profile import PROFILE_FILE as PROFILE_KEY

if TYPE_CHECKING:
    from pagoda.operator.autotune.keys import TuneKey

COMPONENT = "tuned-profile"
A = "serving.pagoda.dev/"
KEY_ANNOTATION = A + "tune-key"  # the key as JSON (for people and for GC)
ATTEMPTS_ANNOTATION = A + "tune-attempts"  # Jobs started so far
STARTED_ANNOTATION = A + "tune-started"  # epoch seconds of the last Job start
FAILURE_ANNOTATION = A + "tune-failure"  # "Reason: message" of the last failed Job
FAILED_ANNOTATION = A + "tune-failed"  # epoch seconds the operator saw it fail
PUBLISHED_ANNOTATION = A + "tune-published"  # written by `pagoda publish-profile`
RETRY_BASE_S = 300.0
RETRY_MAX_S = 6 * 3600.0


def profile_labels() -> dict[str, str]:
    return {
        LABEL_NAME: "pagoda",
        LABEL_COMPONENT: COMPONENT,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: "pagoda",
    }


def is_profile(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_COMPONENT) == COMPONENT and labels.get(LABEL_MANAGED_BY) == MANAGED_BY


def build_profile_config_map(key: TuneKey, namespace: str) -> dict[str, Any]:
    """The empty ConfigMap the Job's ServiceAccount may update (and nothing else)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": key.profile_name,
            "namespace": namespace,
            "labels": profile_labels(),
            "annotations": {
                KEY_ANNOTATION: json.dumps(asdict(key), sort_keys=True),
                ATTEMPTS_ANNOTATION: "0",
            },
        },
        "data": {},
    }


def key_product(cm: Mapping[str, Any]) -> str | None:
    """The GPU product of the key a profile ConfigMap records (None: unreadable)."""
    raw = ((cm.get("metadata") or {}).get("annotations") or {}).get(KEY_ANNOTATION)
    try:
        product = json.loads(raw).get("product") if raw else None
    except (ValueError, AttributeError):
        return None
    return product if isinstance(product, str) else None


def is_tuned(cm: Mapping[str, Any] | None) -> bool:
    return bool(cm) and PROFILE_KEY in (cm.get("data") or {})


def data_hash(cm: Mapping[str, Any]) -> str:
    raw = json.dumps(cm.get("data") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def capacity(cm: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """`profile.json`'s `capacity` ({} when absent or unreadable)."""
    try:
        data = json.loads((cm or {}).get("data", {}).get(PROFILE_KEY) or "{}")
    except ValueError:
        return {}
    cap = data.get("capacity") if isinstance(data, Mapping) else None
    return cap if isinstance(cap, Mapping) else {}


@dataclass(frozen=True)
class Attempts:
    """Retry bookkeeping from the ConfigMap's annotations."""

    count: int
    started: float | None
    failure: str | None
    failed: float | None = None

    @classmethod
    def of(cls, cm: Mapping[str, Any]) -> Attempts:
        ann = (cm.get("metadata") or {}).get("annotations") or {}
        try:  # annotations anyone may edit: a count below 0 or a time that is no time is none
            count = max(0, int(ann.get(ATTEMPTS_ANNOTATION) or 0))
            started, failed = (
                _epoch(ann.get(STARTED_ANNOTATION)),
                _epoch(ann.get(FAILED_ANNOTATION)),
            )
        except ValueError:
            count, started, failed = 0, None, None
        failure = str(ann.get(FAILURE_ANNOTATION) or "")[:1024] or None  # status holds 32 KiB
        return cls(count, started, failure, failed)

    @property
    def since(self) -> float | None:
        """When the backoff counts from: the last failure, or start if no failure was seen."""
        return self.failed if self.failed is not None else self.started

    def retry_at(self, base_s: float = RETRY_BASE_S) -> float:
        """Epoch seconds before which no new Job may start: base × 2^(attempts−1) after the
        last failure (or start, if the failure was never seen), capped."""
        since = self.since
        if not self.count or since is None:
            return 0.0
        backoff = base_s * 2.0 ** min(self.count - 1, 64)
        return since + min(backoff, max(RETRY_MAX_S, base_s))


def _epoch(raw: str | None) -> float | None:
    value = float(raw) if raw else None
    return value if value is not None and math.isfinite(value) else None


def in_future(attempts: Attempts, now: float, slack_s: float = 60.0) -> bool:
    """The backoff counts from a time after `now`: the clock stepped back since (or a hand
    edit); the caller records `now` instead (failure_time_patch), so the wait stays one backoff."""
    since = attempts.since
    return bool(attempts.count) and since is not None and since > now + slack_s


def failure_time_patch(now: float) -> dict[str, Any]:
    return {"metadata": {"annotations": {FAILED_ANNOTATION: f"{now:.3f}"}}}


def start_patch(attempts: Attempts, now: float) -> dict[str, Any]:
    """Recorded before a Job is created: the next attempt's number and start time."""
    return {
        "metadata": {
            "annotations": {
                ATTEMPTS_ANNOTATION: str(attempts.count + 1),
                STARTED_ANNOTATION: f"{now:.3f}",
                FAILED_ANNOTATION: None,
            }
        }
    }


def failure_patch(reason: str, message: str, now: float) -> dict[str, Any]:
    text = f"{reason}: {message}"[:1024]
    return {
        "metadata": {"annotations": {FAILURE_ANNOTATION: text, FAILED_ANNOTATION: f"{now:.3f}"}}
    }
