"""Kubernetes API-server helpers shared by the test emulator's modules: error statuses, RFC 7386
merge patches and timestamps in the API's format."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

import kmock


def _status(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=code, reason=reason, message=message, details=details or {"causes": []}
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
