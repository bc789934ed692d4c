"""The InferenceService that owns the children, and how a child is adopted.

Every child is adopted with `kopf.adopt`: a controller owner reference (with
`blockOwnerDeletion`, so the garbage collector removes the child with its owner), the owner's
namespace and the owner's labels where the child sets none. Pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from pagoda.operator.kube.names import API_VERSION, KIND, standard_labels


@dataclass(frozen=True)
class Owner:
    """Identity of the InferenceService that owns the children."""

    name: str
    namespace: str
    uid: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        meta = body.get("metadata") or {}
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            labels=tuple(sorted((meta.get("labels") or {}).items())),
        )

    def body(self) -> dict[str, Any]:
        """The owner as `kopf.adopt` reads it (the children's owner reference is built from it)."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "labels": dict(self.labels),
            },
        }


def child(owner: Owner, kind: str, api_version: str, name: str) -> dict[str, Any]:
    """A child's skeleton: kind, name, namespace and the standard labels."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": standard_labels(owner.name),
        },
    }


def adopt(obj: dict[str, Any], owner: Owner) -> dict[str, Any]:
    """`kopf.adopt(obj, owner)`, returning `obj` (the builders end with it)."""
    kopf.adopt(obj, owner=owner.body())
    return obj
