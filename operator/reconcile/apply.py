"""Applying one child: create it, or patch it only when it drifted; delete one that must not exist.

"Already exists" (409) and "already gone" (404) between a read and a write are normal: the read is
taken again. A child this InferenceService does not control is never overwritten
(`ChildConflict`). API failures surface as `ApiError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube import drift
from pagoda.operator.kube.client import ApiError
from pagoda.operator.kube.names import KIND, OPTIONAL_KINDS, owned_by
from pagoda.operator.spec.fields import SpecError

if TYPE_CHECKING:
    import logging

    from pagoda.operator.kube.client import KubeApi

UNKNOWN: Any = object()  # `actual` not read yet


class ChildConflict(SpecError):
    """A child's name is taken by an object this InferenceService does not control."""

    def __init__(self, message: str) -> None:
        super().__init__("ResourceConflict", message)


async def apply_child(
    api: KubeApi,
    desired: Mapping[str, Any],
    owner_uid: str,
    logger: logging.Logger,
    *,
    actual: Any = UNKNOWN,
) -> dict[str, Any]:
    """Create the child, or patch it when it drifted; returns the live object. The child records
    the label keys it gets (drift.recorded), so a label no longer desired is removed."""
    desired = drift.recorded(desired)
    kind, meta = desired["kind"], desired["metadata"]
    for attempt in range(3):
        if actual is UNKNOWN or attempt:
            actual = await api.get(kind, meta["namespace"], meta["name"])
        if actual is None:
            try:
                created = await api.create(desired)
            except ApiError as e:
                if e.status == 409:  # someone (another reconcile, a human) created it meanwhile
                    continue
                raise
            logger.info("Created %s %s.", kind, meta["name"])
            return created
        if not owned_by(actual, owner_uid):
            raise ChildConflict(
                f"{kind} {meta['name']!r} exists and is not controlled by this {KIND}"
            )
        if not drift.needs_update(desired, actual):
            return dict(actual)
        try:
            patched = await api.patch(
                kind, meta["namespace"], meta["name"], drift.merge_patch(desired, actual)
            )
        except ApiError as e:
            if e.status == 404:  # deleted meanwhile: create it on the next attempt
                continue
            raise
        logger.info("Updated %s %s.", kind, meta["name"])
        return patched
    raise ApiError(409, "Conflict", f"{kind} {meta['name']!r} kept changing while being applied")


async def delete_child(
    api: KubeApi, kind: str, namespace: str, name: str, owner_uid: str, logger: logging.Logger
) -> None:
    """Delete a child that should no longer exist (only if it is ours)."""
    if kind in OPTIONAL_KINDS and not await api.has_resource(kind):
        return
    actual = await api.get(kind, namespace, name)
    if (
        actual is not None
        and owned_by(actual, owner_uid)
        and await api.delete(kind, namespace, name)
    ):
        logger.info("Deleted %s %s.", kind, name)
