"""A test-only subclass of kmock's KubernetesEmulator that fills the gaps a controller meets.

kmock's emulator stores objects and streams watch events, but (see shared TESTING_NOTES) sets no
uid/resourceVersion/generation/creationTimestamp, streams no-op patches, has no garbage
collector, no status/spec split, no server-side tables, no Scale objects, and answers the core
group's discovery as "/v1". This subclass adds those with the semantics of a real API server:

* create: uid, resourceVersion, generation 1, creationTimestamp, generateName; 409 AlreadyExists;
  status dropped for resources with a status subresource;
* patch (JSON merge patch or JSON patch): 404 NotFound, optional resourceVersion precondition
  (409), `/status` changes only status and the main resource never changes status,
  generation bumps on non-metadata/status change, a no-op patch is not stored or streamed;
* delete: finalizers → deletionTimestamp; otherwise removed, then dependents whose
  ownerReferences point at the removed uid are deleted (background propagation), and objects
  created with only dangling owners are collected too;
* lists carry kind/apiVersion/resourceVersion; `Accept: ...;as=Table` gets a meta.k8s.io/v1
  Table built from the CRD's additionalPrinterColumns (what `kubectl get` prints);
* `/scale` subresource: GET returns an autoscaling/v1 Scale, PATCH sets the replicas path;
* `/api/v1/namespaces[/NAME]` served directly (kmock's path parser cannot route it; kopf lists and
  watches namespaces when it serves specific namespaces);
* `fail(method, plural, status, times)` injects API errors for retry tests.

The read side (lists, discovery, tables, Scale, namespaces) is the `ReadSide` mixin of
kube_emulator_reads.py; the API's error bodies and merge patch are in kube_api.py.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
from kube_api import _now, _status, merge_patch
from kube_emulator_reads import ReadSide

__all__ = ["Emulator", "_status", "merge_patch"]  # faulty_emulator and the drift test import these


class Emulator(ReadSide, kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resource_version = 0
        self.uids: dict[str, tuple[Any, str | None, str]] = {}
        self.printer_columns: dict[Any, list[dict[str, Any]]] = {}
        self.scale_paths: dict[Any, dict[str, str]] = {}
        self.faults: list[list[Any]] = []  # [method, plural, status, remaining]
        self.namespaces: dict[str, dict[str, Any]] = {}
        for name in ("default", "kube-system"):
            self.namespaces[name] = self._namespace(name)

    def fail(self, method: str, plural: str, status: int = 503, times: int = 1) -> None:
        """Answer the next `times` METHOD requests for `plural` with an error `status`."""
        self.faults.append([method.upper(), plural, status, times])

    # --- declaring resources --------------------------------------------------------------

    def declare_crd(self, crd: Mapping[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            res = kmock.resource(spec["group"], version["name"], names["plural"])
            subresources = version.get("subresources") or {}
            self.resources[res] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular"),
                namespaced=spec["scope"] == "Namespaced",
                shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                subresources=set(subresources),
                verbs={
                    "get",
                    "list",
                    "watch",
                    "create",
                    "patch",
                    "update",
                    "delete",
                    "deletecollection",
                },
            )
            self.printer_columns[res] = version.get("additionalPrinterColumns") or []
            if "scale" in subresources:
                self.scale_paths[res] = subresources["scale"]

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        # not .get(): kmock's ResourcesArray creates missing entries on __getitem__
        return self.resources[resource] if resource in self.resources else None  # noqa: SIM401

    def _kind(self, resource: Any) -> str:
        info = self._info(resource)
        return info.kind if info and info.kind else resource.plural.capitalize()

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return bool(info and "status" in info.subresources)

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    # --- plain access for tests -------------------------------------------------------------

    def live(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def live_all(self, resource: str) -> Iterator[dict[str, Any]]:
        res = kmock.resource(resource)
        for (r, _, _), obj in list(self.objects.items()):
            if r == res and not obj.deleted:
                yield copy.deepcopy(obj.raw)

    # --- request routing --------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or res.plural is None or request.action == kmock.action.WATCH:
            return await super()._handle(request)
        for fault in self.faults:
            if fault[3] > 0 and fault[0] == request.method.value and fault[1] == res.plural:
                fault[3] -= 1
                raise _status(
                    fault[2],
                    "ServiceUnavailable" if fault[2] == 503 else "InternalError",
                    "injected fault",
                )
        if request.subresource == "scale" and res in self.scale_paths:
            return aiohttp.web.json_response(await self._serve_scale(request))
        accept = request.headers.get("Accept", "")
        if request.action in (kmock.action.LIST, kmock.action.FETCH) and "as=Table" in accept:
            return aiohttp.web.json_response(self._table(request))
        if request.action == kmock.action.CREATE:
            return aiohttp.web.json_response(await self._create(request), status=201)
        if request.action == kmock.action.UPDATE:
            return aiohttp.web.json_response(await self._update(request))
        if request.action == kmock.action.DELETE and request.name:
            return aiohttp.web.json_response(await self._delete(request))
        if request.method == kmock.method.PUT:
            raise _status(405, "MethodNotAllowed", "PUT is not emulated; use PATCH")
        return await super()._handle(request)

    def _not_found(self, request: kmock.Request) -> kmock.KubernetesError:
        res = request.resource
        group = f".{res.group}" if res.group else ""
        return _status(
            404,
            "NotFound",
            f'{res.plural}{group} "{request.name}" not found',
            name=request.name,
            kind=res.plural,
        )

    def _stored(self, request: kmock.Request) -> Any:
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise self._not_found(request)
        return self.objects[key]

    async def _emit(self, resource: Any, type_: str, raw: Mapping[str, Any]) -> None:
        await self._buses[resource].put({"type": type_, "object": copy.deepcopy(dict(raw))})

    # --- create / update / delete with API-server semantics ------------------------------------

    async def _create(self, request: kmock.Request) -> dict[str, Any]:
        res = request.resource
        if request.subresource:
            raise _status(404, "NotFound", f"subresource {request.subresource} is not emulated")
        data = copy.deepcopy(request.data) if isinstance(request.data, dict) else None
        if data is None:
            raise _status(400, "BadRequest", "the body must be a JSON object")
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise _status(422, "Invalid", "metadata.name: Required value")
        info = self._info(res)
        namespace = (
            (request.namespace or meta.get("namespace"))
            if (info is None or info.namespaced)
            else None
        )
        if namespace:
            meta["namespace"] = namespace
        async with self._lock:
            key = (res, namespace, meta["name"])
            if key in self.objects and not self.objects[key].deleted:
                group = f".{res.group}" if res.group else ""
                raise _status(
                    409, "AlreadyExists", f'{res.plural}{group} "{meta["name"]}" already exists'
                )
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_rv(),
                generation=1,
                creationTimestamp=_now(),
            )
            meta.pop("deletionTimestamp", None)
            if self._has_status(res):
                data.pop("status", None)
            data.setdefault(
                "apiVersion", f"{res.group}/{res.version}" if res.group else res.version
            )
            data.setdefault("kind", self._kind(res))
            if key in self.objects:
                self.objects[key].create(data)
            else:
                self.objects[key] = data
            self.uids[meta["uid"]] = key
            await self._emit(res, "ADDED", data)
            owners = [r.get("uid") for r in meta.get("ownerReferences") or []]
            if owners and not any(uid in self.uids for uid in owners):
                await self._remove(key)  # only dangling owners: the garbage collector takes it
            return copy.deepcopy(data)

    async def _update(self, request: kmock.Request) -> dict[str, Any]:
        res = request.resource
        if request.subresource not in (None, "status"):
            raise _status(404, "NotFound", f"subresource {request.subresource} is not emulated")
        async with self._lock:
            obj = self._stored(request)
            old = copy.deepcopy(obj.raw)
            patch = request.data
            if isinstance(patch, dict):
                want_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if want_rv is not None and str(want_rv) != old["metadata"].get("resourceVersion"):
                    raise _status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version",
                    )
                new = merge_patch(old, patch)
            elif isinstance(patch, list):
                try:
                    new = jsonpatch.apply_patch(old, patch, in_place=False)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                    raise _status(422, "Invalid", f"the JSON patch failed: {e}") from e
            else:
                raise _status(400, "BadRequest", "unsupported patch body")
            new = copy.deepcopy(dict(new))
            if request.subresource == "status":  # only status changes through /status
                new = (
                    {**old, "status": new.get("status")}
                    if new.get("status") is not None
                    else {**old, "status": {}}
                )
            elif self._has_status(res):  # and status never changes through the main resource
                new = {k: v for k, v in new.items() if k != "status"} | (
                    {"status": old["status"]} if "status" in old else {}
                )
            for field in (
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "generation",
                "resourceVersion",
            ):
                if field in old["metadata"]:
                    new.setdefault("metadata", {})[field] = old["metadata"][field]
            if new == old:
                return old  # a no-op: nothing stored, nothing streamed (like a real API server)
            body = {k: v for k, v in new.items() if k not in ("metadata", "status")}
            if body != {k: v for k, v in old.items() if k not in ("metadata", "status")}:
                new["metadata"]["generation"] = int(old["metadata"].get("generation") or 0) + 1
            new["metadata"]["resourceVersion"] = self._next_rv()
            obj.history.append(new)
            meta = new["metadata"]
            key = (res, request.namespace, request.name)
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                await self._remove(key)
            else:
                await self._emit(res, "MODIFIED", new)
            return copy.deepcopy(new)

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        options = request.data if isinstance(request.data, dict) else {}
        async with self._lock:
            obj = self._stored(request)
            raw = copy.deepcopy(obj.raw)
            key = (request.resource, request.namespace, request.name)
            if raw["metadata"].get("deletionTimestamp"):
                return raw
            if raw["metadata"].get("finalizers"):
                raw["metadata"]["deletionTimestamp"] = _now()
                raw["metadata"]["resourceVersion"] = self._next_rv()
                obj.history.append(raw)
                await self._emit(request.resource, "MODIFIED", raw)
                return raw
            await self._remove(key, orphan=options.get("propagationPolicy") == "Orphan")
            return raw

    async def _remove(self, key: Any, *, orphan: bool = False) -> None:
        """Delete for real, then collect the dependents (call with the lock held)."""
        obj = self.objects[key]
        raw = copy.deepcopy(obj.raw)
        raw["metadata"]["resourceVersion"] = self._next_rv()
        obj.delete()
        uid = raw["metadata"].get("uid")
        self.uids.pop(uid, None)
        await self._emit(key[0], "DELETED", raw)
        if orphan or not uid:
            return
        for dep_key, dep in list(self.objects.items()):
            if dep.deleted:
                continue
            refs = dep.raw["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == uid for r in refs):
                continue
            remaining = [r for r in refs if r.get("uid") != uid and r.get("uid") in self.uids]
            dep_raw = copy.deepcopy(dep.raw)
            if remaining:
                dep_raw["metadata"]["ownerReferences"] = remaining
                dep_raw["metadata"]["resourceVersion"] = self._next_rv()
                dep.history.append(dep_raw)
                await self._emit(dep_key[0], "MODIFIED", dep_raw)
            elif dep_raw["metadata"].get("finalizers"):
                dep_raw["metadata"]["deletionTimestamp"] = _now()
                dep_raw["metadata"]["resourceVersion"] = self._next_rv()
                dep.history.append(dep_raw)
                await self._emit(dep_key[0], "MODIFIED", dep_raw)
            else:
                await self._remove(dep_key)
