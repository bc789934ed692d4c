"""Pure comparison of a desired child with the live object, and the merge patch that fixes it.

The live object has fields the API server defaulted (`protocol`, `terminationMessagePath`, ...)
and fields other controllers own (`status`, `clusterIP`, annotations from `kubectl rollout
restart`). So "in sync" means: everything we want is there (desired ⊆ live, lists compared
element-wise), maps we own wholly (`OWNED_MAPS`) have no extra keys, and optional fields only we
write (`OWNED_OPTIONAL`) are not there when we do not want them. The fix is a JSON merge
patch (RFC 7386): our fields replace theirs, lists are replaced whole, and extra keys of owned
maps are set to null.

A child's labels are shared: the operator sets its own and the service's (kopf.adopt), others
add theirs (a mesh, a cost tool). Like `kubectl apply`'s last-applied record, each child carries
the keys of the labels the operator set (`APPLIED_LABELS`, written with them): a key recorded
there that the desired child no longer has (a label taken off the InferenceService) is the
operator's to remove; a key never recorded is someone else's and stays. Server-side apply would
do the same through managedFields, but it would take ownership of every field the operator
writes with merge patches today (the replicas the autoscaler sets, lists replaced whole) and
needs a field-manager migration of existing children; this keeps one write path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from pagoda.operator.kube.names import APPLIED_LABELS_ANNOTATION, OWNED_MAPS, OWNED_OPTIONAL

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
# Keys whose values (or, for the resource maps, whose map's values) are quantities, which the API
# server stores in canonical form ("1.5Gi" reads back "1536Mi", "0.5" as "500m").
_QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit", "divisor"})


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "16Gi", 2) as a Decimal; None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value.strip())
    if not m:
        return None
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:
        return None
    suffix = m.group(2) or ""
    if suffix not in _SUFFIX:  # a decimal exponent ("1e3"); "E" and "Ei" are exa suffixes
        return number * (Decimal(10) ** int(suffix[1:]))
    return number * _SUFFIX[suffix]


def _equal(desired: Any, actual: Any, quantities: bool) -> bool:
    if desired == actual:
        return True
    if quantities:
        a, b = parse_quantity(desired), parse_quantity(actual)
        return a is not None and a == b
    return False


def is_subset(desired: Any, actual: Any, *, _quantities: bool = False) -> bool:
    """Whether everything in `desired` is present and equal in `actual`."""
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(
            key in actual
            and is_subset(value, actual[key], _quantities=_quantities or key in _QUANTITY_KEYS)
            for key, value in desired.items()
        )
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if (
            not isinstance(actual, Sequence)
            or isinstance(actual, str)
            or len(desired) != len(actual)
        ):
            return False
        return all(
            is_subset(d, a, _quantities=_quantities) for d, a in zip(desired, actual, strict=True)
        )
    return _equal(desired, actual, _quantities)


def _dig(obj: Mapping[str, Any] | None, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _extra_keys(
    desired: Mapping[str, Any], actual: Mapping[str, Any], path: Sequence[str]
) -> set[str]:
    live = _dig(actual, path)
    want = _dig(desired, path) or {}
    return set(live) - set(want) if isinstance(live, Mapping) else set()


def recorded(desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` with the record of the label keys it sets (`APPLIED_LABELS_ANNOTATION`)."""
    out = dict(desired)
    meta = dict(out.get("metadata") or {})
    keys = ",".join(sorted(meta.get("labels") or {}))
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_LABELS_ANNOTATION: keys}
    out["metadata"] = meta
    return out


def _dropped_labels(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> set[str]:
    """Labels the operator applied before (recorded on the live child), live still, and no longer
    desired: the ones to remove. A child without the record (made before it) drops none."""
    live = actual.get("metadata") or {}
    record = (live.get("annotations") or {}).get(APPLIED_LABELS_ANNOTATION) or ""
    applied = {k for k in record.split(",") if k}
    want = (desired.get("metadata") or {}).get("labels") or {}
    return {k for k in applied - set(want) if k in (live.get("labels") or {})}


def needs_update(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """Whether the live object drifted from the desired one (see the module docstring)."""
    if not is_subset(_comparable(desired), actual):
        return True
    if _stale_optional(desired, actual) or _dropped_labels(desired, actual):
        return True
    return any(_extra_keys(desired, actual, path) for path in OWNED_MAPS.get(desired["kind"], ()))


def _stale_optional(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Paths of `OWNED_OPTIONAL` fields that are live but not wanted."""
    return [
        path
        for path in OWNED_OPTIONAL.get(desired["kind"], ())
        if _dig(desired, path) is None and _dig(actual, path)
    ]


def _comparable(desired: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a desired manifest that is ours to enforce (identity fields excluded)."""
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = desired.get("metadata") or {}
    body["metadata"] = {
        k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta
    }
    return body


def merge_patch(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `actual` into something `needs_update` accepts."""
    patch = copy.deepcopy(_comparable(desired))
    for path in _stale_optional(desired, actual):
        _put(patch, path, None)
    for key in _dropped_labels(desired, actual):
        _put(patch, ("metadata", "labels", key), None)
    for path in OWNED_MAPS.get(desired["kind"], ()):
        extra = _extra_keys(desired, actual, path)
        if not extra:
            continue
        if _dig(desired, path) is None:  # we want no such map at all
            _put(patch, path, None)
        else:
            target = _dig(patch, path)
            for key in extra:
                target[key] = None
    return patch


def _put(obj: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value
