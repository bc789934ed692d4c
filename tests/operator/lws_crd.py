"""The upstream LeaderWorkerSet CRD (kubernetes-sigs/lws v0.9.0, data/lws/README.md) and
validation of LeaderWorkerSets against it: the CRD's own openAPIV3Schema (strict, as the API
server's field validation), and each embedded pod template with kubernetes-validate (strict)."""

from __future__ import annotations

import copy
import functools
import gzip
import pathlib
from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import yaml
from crd_schema import schema_errors, version_schema

LWS_CRD_PATH = (
    pathlib.Path(__file__).parent
    / "data"
    / "lws"
    / "leaderworkerset.x-k8s.io_leaderworkersets.yaml.gz"
)
LWS_RESOURCE = "leaderworkerset.x-k8s.io/v1/leaderworkersets"


@functools.cache
def _load() -> dict[str, Any]:
    with gzip.open(LWS_CRD_PATH, "rt", encoding="utf-8") as f:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return yaml.load(f, Loader=loader)  # a safe loader (the C one when built)


def load_lws_crd() -> dict[str, Any]:
    """A copy of the CRD (callers may change theirs)."""
    return copy.deepcopy(_load())


def lws_errors(lws: Mapping[str, Any], k8s_version: str = "1.32.0") -> list[str]:
    """Every reason the API server would refuse this LeaderWorkerSet (empty: valid)."""
    errors = schema_errors(version_schema(_load(), "v1"), lws)
    templates = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    for role in ("leaderTemplate", "workerTemplate"):
        if role not in templates:
            continue
        doc = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{lws['metadata']['name']}-{role}"},
            "template": templates[role],
        }
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{role}: {e}")
    return errors
