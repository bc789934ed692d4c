"""Every Kubernetes API call the operator makes (besides kopf's own watching/patching/events).

A small asyncio REST client over aiohttp that logs in the way kopf does (service account, then
kubeconfig); docs/operator.md says why it is not kubernetes_asyncio or kr8s. rbac.py lists the
permissions these calls need.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import aiohttp
import kopf
from pagoda.operator.kube.names import RESOURCES, now_iso

USER_AGENT = "pagoda-operator/0.1"
MERGE_PATCH = "application/merge-patch+json"
log = logging.getLogger(__name__)


class ApiError(Exception):
    """A failed API call; `status` 0 means the server could not be reached."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying with backoff: unreachable (0), 5xx, 429, 408, 409 (a concurrent
        writer), 404 (something vanished between a read and a write), 401/403 (credentials or
        RBAC being fixed). Other 4xx say the request itself is wrong: a retry cannot help."""
        return self.status in (0, 401, 403, 404, 408, 409, 429) or self.status >= 500


def error_from_response(status: int, reason: str, text: str) -> ApiError:
    """An error response as ApiError, keeping its HTTP status whatever the body is (a Status
    object from the API server, or plain text / HTML from a proxy in front of it)."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return ApiError(status, data.get("reason") or reason, str(data.get("message") or "")[:1024])
    return ApiError(status, reason, " ".join(text.split())[:512])


def event_body(
    involved: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
) -> dict[str, Any]:
    """A core/v1 Event about `involved` (pure)."""
    meta = involved["metadata"]
    now = now_iso()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": os.environ.get("HOSTNAME", component),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


LoginFn = Callable[[], kopf.ConnectionInfo]


def default_login() -> kopf.ConnectionInfo:
    """Credentials the way kopf finds them: in-cluster service account, else kubeconfig."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("No service account token and no kubeconfig (set KUBECONFIG).")
    return info


@contextlib.contextmanager
def _pem_file(data: str | bytes) -> Iterator[str]:
    raw = base64.b64decode(data) if isinstance(data, str) and "BEGIN" not in data else data
    with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as f:
        f.write(raw.encode() if isinstance(raw, str) else raw)
    try:
        yield f.name
    finally:
        os.unlink(f.name)


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | None:
    if not info.server.startswith("https"):
        return None
    cadata = None
    if info.ca_data:
        raw = info.ca_data if isinstance(info.ca_data, str) else info.ca_data.decode()
        cadata = raw if "BEGIN" in raw else base64.b64decode(raw).decode()
    ctx = ssl.create_default_context(
        cafile=str(info.ca_path) if info.ca_path else None, cadata=cadata
    )
    if info.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert, key = (
        info.certificate_path or info.certificate_data,
        info.private_key_path or info.private_key_data,
    )
    if cert and key:
        with contextlib.ExitStack() as stack:
            cert_file = (
                str(info.certificate_path)
                if info.certificate_path
                else stack.enter_context(_pem_file(cert))
            )
            key_file = (
                str(info.private_key_path)
                if info.private_key_path
                else stack.enter_context(_pem_file(key))
            )
            ctx.load_cert_chain(cert_file, key_file)
    return ctx


class KubeApi:
    """The operator's API client. Create inside a running event loop; `close()` when done."""

    def __init__(
        self,
        login: LoginFn = default_login,
        *,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        discovery_ttl_s: float = 60.0,
        user_agent: str = USER_AGENT,
        on_error: Callable[[int, str], None] | None = None,
    ) -> None:
        self._login = login
        self._on_error = on_error  # (HTTP status, 0 if unreachable; method) of each failed call
        self.failing_since: float | None = None  # monotonic time of the first failure in a row
        # (namespace, name) → (monotonic time of the first failure, the error) of status writes
        # failing since their last success: /readyz reports an operator that cannot write status
        self.status_failures: dict[tuple[str | None, str], tuple[float, ApiError]] = {}
        self._user_agent = user_agent
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, connect=connect_timeout_s)
        self._discovery_ttl_s = discovery_ttl_s
        self._discovery: dict[str, tuple[float, bool]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._info: kopf.ConnectionInfo | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _connect(self, *, fresh: bool) -> tuple[aiohttp.ClientSession, str]:
        async with self._lock:
            if self._session is not None and self._info is not None and not fresh:
                return self._session, self._info.server.rstrip("/")
            if self._session is not None:
                await self._session.close()
            info = await asyncio.to_thread(self._login)
            headers = {"User-Agent": self._user_agent, "Accept": "application/json"}
            if info.token:
                headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
            auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
            self._info = info
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=_ssl_context(info) or False, limit=20),
                headers=headers,
                auth=auth,
                timeout=self._timeout,
            )
            return self._session, info.server.rstrip("/")

    async def request(
        self, method: str, path: str, *, body: Any = None, params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:  # fmt: skip
        """One API call; returns the decoded JSON body or raises :class:`ApiError`."""
        try:
            status, reason, text = await self._send(method, path, body, params, content_type)
        except ApiError as e:
            self._record(e.status, method)
            raise
        self._record(status, method)
        if status >= 400:
            raise error_from_response(status, reason, text)
        try:
            return json.loads(text) if text.strip() else None
        except ValueError as e:  # a proxy's answer, not the API server's
            raise ApiError(0, "InvalidResponse", f"{method} {path}: HTTP {status}, not JSON") from e

    async def _send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, ctype: str
    ) -> tuple[int, str, str]:
        """(status, reason, text) of one call; a rotated token gets one fresh login."""
        # strict JSON: a NaN or Infinity is refused here, as the API server would (400)
        payload = None if body is None else json.dumps(body, allow_nan=False)
        for attempt in (0, 1):
            session, server = await self._connect(fresh=attempt > 0)
            try:
                async with session.request(
                    method, server + path, data=payload, params=params,
                    headers={"Content-Type": ctype},
                ) as resp:  # fmt: skip
                    if resp.status == 401 and attempt == 0:
                        continue
                    return resp.status, resp.reason or "", await resp.text(errors="replace")
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                raise ApiError(0, "Unavailable", f"{method} {path}: {e!r}") from e
        return 401, "Unauthorized", "credentials rejected twice"

    def _record(self, status: int, method: str) -> None:
        """Health bookkeeping: when the API server stopped answering, and the error counter."""
        if status == 0 or status >= 500:
            if self.failing_since is None:
                self.failing_since = time.monotonic()
        else:
            self.failing_since = None
        not_found_read = status == 404 and method == "GET"  # an answer, not an error
        if (status == 0 or status >= 400) and not not_found_read and self._on_error is not None:
            self._on_error(status, method)

    def unreachable_for(self) -> float:
        """Seconds since the API server last answered (0 while it answers; 5xx counts as not)."""
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def status_unwritable(self) -> tuple[float, str, ApiError] | None:
        """The status write failing the longest: (seconds, "namespace/name", its last error)."""
        if not self.status_failures:
            return None
        (ns, name), (since, error) = min(self.status_failures.items(), key=lambda kv: kv[1][0])
        return time.monotonic() - since, f"{ns}/{name}", error

    def forget_status(self, namespace: str | None, name: str) -> None:
        """The object is gone: its failing status writes no longer count."""
        self.status_failures.pop((namespace, name), None)

    # --- typed helpers ----------------------------------------------------------------------

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", RESOURCES[kind].path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        data = await self.request("GET", RESOURCES[kind].path(namespace))
        return list((data or {}).get("items") or [])

    async def list_all(self, kind: str, namespaces: Iterable[str] = ()) -> list[dict[str, Any]]:
        """Every `kind` object in `namespaces` (none: cluster-wide), deleting ones left out.

        Items of a list carry no apiVersion/kind; they are filled in, so each is a full body.
        """
        res = RESOURCES[kind]
        items: list[dict[str, Any]] = []
        for namespace in tuple(namespaces) or (None,):
            items += await self.list(kind, namespace)
        for item in items:
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return [i for i in items if not (i.get("metadata") or {}).get("deletionTimestamp")]

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self.request(
            "POST", RESOURCES[obj["kind"]].path(meta.get("namespace")), body=obj
        )

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        path = RESOURCES[kind].path(namespace, name, subresource)
        if subresource != "status":
            return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        try:
            out = await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        except ApiError as e:
            if e.status == 404:  # gone: nothing left to write
                self.forget_status(namespace, name)
            else:
                since = self.status_failures.get((namespace, name), (time.monotonic(), e))[0]
                self.status_failures[namespace, name] = (since, e)
            raise
        self.forget_status(namespace, name)
        return out

    async def delete(self, kind: str, namespace: str | None, name: str) -> bool:
        try:
            await self.request(
                "DELETE",
                RESOURCES[kind].path(namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def post_event(
        self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> None:
        """Record a core/v1 Event about `involved`."""
        event = event_body(
            involved, type_=type_, reason=reason, message=message, component=component
        )
        await self.request(
            "POST", f"/api/v1/namespaces/{event['metadata']['namespace']}/events", body=event
        )

    async def try_post_event(
        self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str
    ) -> bool:
        """Post an Event; a failure is logged and swallowed (an Event is never worth a retry)."""
        try:
            await self.post_event(
                involved, type_=type_, reason=reason, message=message, component=component
            )
        except ApiError as e:
            log.warning("Could not post the %s event: %s", reason, e)
            return False
        return True

    async def has_resource(self, kind: str) -> bool:
        """Whether the API server serves `kind` (discovery, cached for a minute)."""
        res = RESOURCES[kind]
        cached = self._discovery.get(kind)
        if cached and time.monotonic() - cached[0] < self._discovery_ttl_s:
            return cached[1]
        path = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        try:
            data = await self.request("GET", path)
            found = any(r.get("name") == res.plural for r in (data or {}).get("resources") or [])
        except ApiError as e:
            if e.status not in (404, 503):
                raise
            found = False
        self._discovery[kind] = (time.monotonic(), found)
        return found
