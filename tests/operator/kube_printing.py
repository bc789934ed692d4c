"""Server-side printing for the emulator: the Table that `kubectl get` asks for.

A real API server answers `Accept: application/json;as=Table;g=meta.k8s.io;v=v1` with rows
built from the CRD's additionalPrinterColumns (JSONPath), dates shown as ages.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any


def age(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc
    )
    seconds = max(0, int((datetime.datetime.now(datetime.timezone.utc) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


_FILTER = re.compile(r"^\[\?\(@\.(\w+)==\"([^\"]*)\"\)\]")


def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath used by printer columns: .a.b, [N], [?(@.k=="v")]."""
    rest = path
    while rest:
        if m := _FILTER.match(rest):
            key, value = m.groups()
            obj = next(
                (i for i in obj or [] if isinstance(i, Mapping) and i.get(key) == value), None
            )
            rest = rest[m.end() :]
        elif m := re.match(r"^\[(\d+)\]", rest):
            idx = int(m.group(1))
            obj = obj[idx] if isinstance(obj, list) and idx < len(obj) else None
            rest = rest[m.end() :]
        elif m := re.match(r"^\.([\w-]+)", rest):
            obj = obj.get(m.group(1)) if isinstance(obj, Mapping) else None
            rest = rest[m.end() :]
        else:
            raise ValueError(f"unsupported JSONPath {path!r}")
        if obj is None:
            return None
    return obj


def build_table(
    objs: Sequence[Mapping[str, Any]], printer_columns: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table; all columns are sent, kubectl hides priority > 0 unless -o wide."""
    columns = list(printer_columns) or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    definitions = [
        {"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}
    ]
    definitions += [
        {
            "name": c["name"],
            "type": c["type"],
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    rows = []
    for obj in sorted(objs, key=lambda o: o["metadata"]["name"]):
        cells: list[Any] = [obj["metadata"]["name"]]
        for c in columns:
            value = jsonpath(obj, c["jsonPath"])
            cells.append(age(value) if c["type"] == "date" else value)
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"],
        }
        rows.append({"cells": cells, "object": partial})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": definitions,
        "rows": rows,
    }
