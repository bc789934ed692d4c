"""The read side of the test Kubernetes emulator (a mixin of kube_emulator.Emulator): typed
lists, core-group discovery as "v1", server-side Tables, the `/scale` subresource, and
`/api/v1/namespaces[/NAME]`, which kmock's path parser cannot route.

It uses the Emulator's state and write path (`namespaces`, `printer_columns`, `scale_paths`,
`_next_rv`, `_kind`, `_stored`, `_not_found`, `_update`, `_lock`)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import uuid
from typing import Any

import aiohttp.web
import kmock
from kube_api import _now, _status
from kube_printing import build_table, jsonpath


class ReadSide:
    # --- namespaces (kmock's path parser cannot route /api/v1/namespaces[/NAME]) ---------

    def _namespace(self, name: str) -> dict[str, Any]:
        meta = {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": self._next_rv(),
            "creationTimestamp": _now(),
        }
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": meta,
            "status": {"phase": "Active"},
        }

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        m = re.fullmatch(r"/api/v1/namespaces(?:/([^/]+))?/?", raw.path)
        if m is None:
            return await super().__call__(raw)
        name = m.group(1)
        if raw.method == "POST" and name is None:
            body = await raw.json()
            new = self._namespace(body["metadata"]["name"])
            self.namespaces.setdefault(new["metadata"]["name"], new)
            return aiohttp.web.json_response(new, status=201)
        if raw.method != "GET":
            return aiohttp.web.json_response(
                {"kind": "Status", "code": 405, "reason": "MethodNotAllowed"}, status=405
            )
        if name is not None:
            found = self.namespaces.get(name)
            status = 200 if found else 404
            return aiohttp.web.json_response(
                found or {"kind": "Status", "code": 404, "reason": "NotFound"}, status=status
            )
        if raw.query.get("watch") != "true":
            items = [copy.deepcopy(n) for n in self.namespaces.values()]
            meta = {"resourceVersion": str(self.resource_version)}
            return aiohttp.web.json_response(
                {"apiVersion": "v1", "kind": "NamespaceList", "metadata": meta, "items": items}
            )
        response = aiohttp.web.StreamResponse()
        await response.prepare(raw)
        for namespace in list(self.namespaces.values()):
            await response.write(
                json.dumps({"type": "ADDED", "object": namespace}).encode() + b"\n"
            )
        await asyncio.sleep(
            float(raw.query.get("timeoutSeconds") or 300)
        )  # no namespace events here
        return response

    # --- read-side additions -----------------------------------------------------------------

    async def _serve_list(self, request: kmock.Request) -> Any:
        data = await super()._serve_list(request)
        res = request.resource
        data["kind"] = f"{self._kind(res)}List"
        data["apiVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        data["metadata"] = {"resourceVersion": str(self.resource_version)}
        return data

    async def _serve_version(self, request: kmock.Request) -> Any:
        data = await super()._serve_version(request)
        if request.resource.group == "":
            data["groupVersion"] = request.resource.version  # "v1", not "/v1"
        for item in data.get("resources", []):
            if "/" in item["name"]:  # subresources have no short names or categories
                item.update(shortNames=[], categories=[])
            if item["name"].endswith("/scale"):
                item.update(group="autoscaling", version="v1", kind="Scale")
        return data

    def _matching(self, request: kmock.Request) -> list[dict[str, Any]]:
        found = []
        for (res, namespace, name), obj in list(self.objects.items()):
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            found.append(obj.raw)
        return found

    def _table(self, request: kmock.Request) -> dict[str, Any]:
        objs = self._matching(request)
        if request.name is not None and not objs:
            raise self._not_found(request)
        table = build_table(objs, self.printer_columns.get(request.resource, []))
        table["metadata"] = {"resourceVersion": str(self.resource_version)}
        return table

    async def _serve_scale(self, request: kmock.Request) -> dict[str, Any]:
        paths = self.scale_paths[request.resource]
        if request.action == kmock.action.UPDATE or request.method == kmock.method.PUT:
            body = request.data if isinstance(request.data, dict) else {}
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise _status(422, "Invalid", "spec.replicas must be a non-negative integer")
            spec_path = paths["specReplicasPath"].lstrip(".").split(".")
            patch: dict[str, Any] = {}
            cursor = patch
            for key in spec_path[:-1]:
                cursor = cursor.setdefault(key, {})
            cursor[spec_path[-1]] = replicas
            inner = kmock.Request(
                method=kmock.method.PATCH, resource=request.resource, namespace=request.namespace,
                name=request.name, data=patch, action=kmock.action.UPDATE,
            )  # fmt: skip
            obj = await self._update(inner)
        else:
            async with self._lock:
                obj = copy.deepcopy(self._stored(request).raw)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"][k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in obj["metadata"]
            },
            "spec": {"replicas": jsonpath(obj, paths["specReplicasPath"]) or 0},
            "status": {
                "replicas": jsonpath(obj, paths["statusReplicasPath"]) or 0,
                **(
                    {"selector": s}
                    if (s := jsonpath(obj, paths.get("labelSelectorPath", ".none")))
                    else {}
                ),
            },
        }
