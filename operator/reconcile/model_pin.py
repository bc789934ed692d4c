"""An hf:// model named by a branch or tag (`hf://ORG/NAME` is `main`) pinned to one commit, so
every replica of an InferenceService downloads and serves the same files.

Without a pin each pod's `model-download` init container asks the Hub what the branch is now: a
push between two pods' starts (a scale-up, a rescheduled pod, a rollout) makes the replicas of
one service serve different weights. So the operator asks once, with huggingface_hub's
`model_info` and the token of `spec.modelSecretRef`'s Secret (`HF_TOKEN`, else
`HUGGING_FACE_HUB_TOKEN`), against the `HF_ENDPOINT` the download container gets (spec.env's,
else the Secret's; else the operator's own, else the Hub), and the pods get `--revision COMMIT`
(download and serve; `--model` stays as written, so a tuned profile and the served name do not
change), as does the tuning Job of spec.autotune (autotune/loop.py reads the pin through
`recorded_spec` and starts no Job before there is one). The pin is kept in `status.model`:

    status.model: {uri: hf://ORG/NAME, commit: SHA, resolvedAt: TIME, resolveRequest: VALUE}

and read back on every reconcile, so a resync or an operator restart never moves it. It moves
when `spec.model` changes, or when the annotation `pagoda.dev/resolve-model` is set to a
value the pin was not resolved for (any new value: `kubectl annotate isvc NAME
pagoda.dev/resolve-model="$(date +%s)" --overwrite`), which rolls the pods onto the
branch's head. Other spec changes (replicas among them) keep it. A model named by a commit
needs no pin; `pagoda operator --no-pin-models` turns pinning off.

The hf:// LoRA adapters of `spec.adapters` named by a branch or tag are pinned alike, with the
same token and endpoint: each once, kept in its item of `status.adapters`

    status.adapters: [{name: NAME, source: hf://ORG/NAME, commit: SHA, resolvedAt: TIME,
                       resolveRequest: VALUE}, ...]

and fetched by the `adapter-download` init container as `hf://ORG/NAME@SHA`. An adapter's pin
moves when its own source (or name) changes, or with the annotation; another adapter's change,
or spec.model's, keeps it. s3:// adapters have no commits (fetched as written), paths need none.
The model and the adapters to pin are asked at the same time (at most MAX_CONCURRENT_RESOLVES
requests at once).

A failed resolution is the condition `Degraded`, reason `ModelResolveFailed`, with the
download's failure class (`Unauthorized`, `NotFound`, `Unreachable`, `Failed`) in the message
(each failed source's, naming its field, when several fail);
the children are left as they are (running replicas keep their pin). A 5xx or an unreachable
Hub is retried with backoff; a 401/404 waits for a change (the spec, the annotation, or the
Secret, seen at the next resync).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.names import now_iso
from pagoda.operator.spec.fields import SpecError
from pagoda.runtime.model.sources.uri import COMMIT, HfURI, parse_uri

if TYPE_CHECKING:
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.spec.inference_service import InferenceServiceSpec
    from pagoda.operator.spec.model_ref import Adapter, ModelRef
    from pagoda.runtime.model.sources.errors import DownloadError

# not under serving.pagoda.dev/, kopf's storage prefix: kopf leaves the annotations under it out
# of the diff its update handler reacts to
RESOLVE_ANNOTATION = "pagoda.dev/resolve-model"
REASON = "ModelResolveFailed"
TOKEN_KEYS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # huggingface_hub's order
# Hub requests of one reconcile in flight at once (spec.model and up to 64 spec.adapters)
MAX_CONCURRENT_RESOLVES = 8
log = logging.getLogger(__name__)


class ModelUnresolved(SpecError):
    """The Hub did not say which commit the revision is; `transient`: worth retrying soon."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(REASON, message)
        self.transient = transient


def needs_pin(spec: InferenceServiceSpec) -> bool:
    return _needs(spec.model)


def _needs(ref: ModelRef) -> bool:
    """An hf:// source named by a branch or tag (no revision: `main`), not by a commit."""
    return ref.source == "hf" and not COMMIT.match(_revision(ref.uri) or "")


def _revision(uri: str) -> str | None:
    return parse_uri(uri).revision  # type: ignore[union-attr]


def _request(body: Mapping[str, Any]) -> str:
    return ((body.get("metadata") or {}).get("annotations") or {}).get(RESOLVE_ANNOTATION, "")


def _valid(record: Any, uri: str, key: str, request: str) -> bool:
    """Whether `record` (status.model or an item of status.adapters) pins `uri` for `request`."""
    if not isinstance(record, Mapping):
        return False
    commit = record.get("commit")
    same = record.get(key) == uri and record.get("resolveRequest", "") == request
    return same and isinstance(commit, str) and bool(COMMIT.match(commit))


def recorded(body: Mapping[str, Any], spec: InferenceServiceSpec) -> Mapping[str, Any] | None:
    """`status.model` if it pins this spec's model for the current resolve request."""
    pin = (body.get("status") or {}).get("model")
    valid = _valid(pin, spec.model.uri, "uri", _request(body))
    return pin if valid else None  # type: ignore[return-value]


def recorded_adapters(
    body: Mapping[str, Any], spec: InferenceServiceSpec
) -> dict[str, Mapping[str, Any]]:
    """The items of `status.adapters` that pin an adapter of this spec (same name and source)
    for the current resolve request, by name; adapters that need no pin are not among them."""
    items = (body.get("status") or {}).get("adapters")
    items = items if isinstance(items, list) else []
    by_name = {i.get("name"): i for i in items if isinstance(i, Mapping)}
    request = _request(body)
    return {
        a.name: by_name[a.name]
        for a in spec.adapters
        if _needs(a.source) and _valid(by_name.get(a.name), a.source.uri, "source", request)
    }


def pinned(
    spec: InferenceServiceSpec,
    pin: Mapping[str, Any] | None,
    adapters: Mapping[str, Mapping[str, Any]] | None = None,
) -> InferenceServiceSpec:
    """`spec` with the model's pin and the adapters' (by name) as their sources' commits."""
    if pin is not None:
        spec = dataclasses.replace(
            spec, model=dataclasses.replace(spec.model, commit=pin["commit"])
        )
    if adapters:
        spec = dataclasses.replace(
            spec, adapters=tuple(_with_pin(a, adapters.get(a.name)) for a in spec.adapters)
        )
    return spec


def _with_pin(adapter: Adapter, pin: Mapping[str, Any] | None) -> Adapter:
    if pin is None:
        return adapter
    return dataclasses.replace(
        adapter, source=dataclasses.replace(adapter.source, commit=pin["commit"])
    )


def served_adapters(
    spec: InferenceServiceSpec, pins: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`status.adapters`: name and source of each adapter, with its pin (commit, resolvedAt,
    resolveRequest) where it has one."""
    return [{**pins.get(a.name, {}), "name": a.name, "source": a.source.uri} for a in spec.adapters]


def recorded_spec(
    body: Mapping[str, Any], spec: InferenceServiceSpec, config: OperatorConfig
) -> InferenceServiceSpec | None:
    """`spec` with the pins `status.model` and `status.adapters` record (as is when it needs
    none); None when it needs one not recorded yet (or to be resolved again): whoever builds from
    it waits for `pin`. Asks nothing: what a child restored outside the full reconcile, or the
    tuning Job, is built with."""
    if not config.pin_models:
        return spec
    found = recorded(body, spec) if needs_pin(spec) else None
    if needs_pin(spec) and found is None:
        return None
    adapters = recorded_adapters(body, spec)
    if any(_needs(a.source) and a.name not in adapters for a in spec.adapters):
        return None
    return pinned(spec, found, adapters)


def recorded_model_spec(
    body: Mapping[str, Any], spec: InferenceServiceSpec, config: OperatorConfig
) -> InferenceServiceSpec | None:
    """`recorded_spec` for the model alone, adapters as written: the tuning Job's (it measures
    the base model, never an adapter, so an adapter's pin is no reason to wait)."""
    if not config.pin_models or not needs_pin(spec):
        return spec
    found = recorded(body, spec)
    return None if found is None else pinned(spec, found)


async def pin(
    api: KubeApi,
    body: Mapping[str, Any],
    spec: InferenceServiceSpec,
    config: OperatorConfig,
    logger: logging.Logger,
) -> tuple[InferenceServiceSpec, Mapping[str, Any] | None, dict[str, Mapping[str, Any]]]:
    """(the spec with its model and adapters pinned, the `status.model` to write: None removes
    it, the adapters' pins by name for `status.adapters`). Asks the Hub only for what status
    does not pin for the current request already: a new or changed source, or a new request."""
    if not config.pin_models:
        return spec, None, {}
    request = _request(body)
    found = recorded(body, spec) if needs_pin(spec) else None
    adapters = recorded_adapters(body, spec)
    todo = [
        (f"spec.adapters[{i}] ({a.name})", a)
        for i, a in enumerate(spec.adapters)
        if _needs(a.source) and a.name not in adapters
    ]
    model = needs_pin(spec) and found is None
    asks = [("spec.model", spec.model.uri)] if model else []
    asks += [(where, a.source.uri) for where, a in todo]
    if asks:
        hub = await _hub(api, body, spec)
        got = await _pin_all(asks, hub, config, logger, request)
        if model:
            found = {"uri": spec.model.uri, **got.pop(0)}
        for (_, a), pin_ in zip(todo, got):
            adapters[a.name] = {"name": a.name, "source": a.source.uri, **pin_}
    return pinned(spec, found, adapters), found, adapters


async def _pin_all(
    asks: list[tuple[str, str]],
    hub: tuple[str | None, str | None],
    config: OperatorConfig,
    logger: logging.Logger,
    request: str,
) -> list[dict[str, str]]:
    """The pins of `asks` ((where, uri) pairs), in their order: asked at the same time, at most
    MAX_CONCURRENT_RESOLVES at once (each a thread of the default executor: huggingface_hub
    blocks), so many adapters take about one answer's time rather than one each. Every ask runs
    to its end; a failed one is a ModelUnresolved naming its field (`spec.adapters[i] (NAME)`),
    several are one, each named, transient when any is (a retry may settle it)."""
    bound = asyncio.Semaphore(MAX_CONCURRENT_RESOLVES)

    async def one(where: str, uri: str) -> dict[str, str]:
        async with bound:
            return await _pin_one(uri, where, hub, config, logger, request)

    results = await asyncio.gather(*(one(w, u) for w, u in asks), return_exceptions=True)
    pins = [r for r in results if not isinstance(r, BaseException)]
    if len(pins) == len(results):
        return pins
    failed = []
    for error in results:
        if isinstance(error, ModelUnresolved):
            failed.append(error)
        elif isinstance(error, BaseException):
            raise error  # not the Hub's answer (a bug, a cancellation): as it is
    if len(failed) == 1:
        raise failed[0]
    raise ModelUnresolved(
        f"{len(failed)} sources could not be resolved: " + " | ".join(e.message for e in failed),
        transient=any(e.transient for e in failed),
    ) from failed[0]


async def _pin_one(
    uri: str,
    where: str,
    hub: tuple[str | None, str | None],
    config: OperatorConfig,
    logger: logging.Logger,
    request: str,
) -> dict[str, str]:
    commit = await _resolve(uri, where, hub, config)
    logger.info("Pinned %s %s (%s) to commit %s.", where, uri, _revision(uri) or "main", commit)
    found = {"commit": commit, "resolvedAt": now_iso()}
    if request:
        found["resolveRequest"] = request
    return found


async def _hub(
    api: KubeApi, body: Mapping[str, Any], spec: InferenceServiceSpec
) -> tuple[str | None, str | None]:
    """(the token, the endpoint) the download containers get."""
    namespace = (body.get("metadata") or {}).get("namespace")
    secret = await _secret(api, namespace, spec.model_secret)
    token = next((secret[k] for k in TOKEN_KEYS if secret.get(k)), None)
    return token, _endpoint(spec, secret)


async def _resolve(
    uri: str, where: str, hub: tuple[str | None, str | None], config: OperatorConfig
) -> str:
    from pagoda.runtime.model.sources import errors

    token, endpoint = hub
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_model_sha, uri, endpoint, token, config.hub_timeout_s),
            config.hub_timeout_s * 3,
        )
    except Exception as e:
        failure = _classify(uri, e, token, endpoint)
        transient = failure.detail in (errors.UNREACHABLE, errors.FAILED)
        what = "" if where == "spec.model" else f"{where} "
        raise ModelUnresolved(
            f"could not resolve {what}{uri} to a commit ({failure.detail}): {failure}; "
            + ("retrying" if transient else f"fix it, then change {where.split('[')[0]} or the "
               f"{RESOLVE_ANNOTATION} annotation (or wait for the resync)")
            + "; the pods are left as they are",
            transient=transient,
        ) from e  # fmt: skip


def _model_sha(uri: str, endpoint: str | None, token: str | None, timeout: float) -> str:
    from huggingface_hub import HfApi
    from pagoda.runtime.model.sources import errors
    from pagoda.runtime.model.sources.errors import DownloadError

    ref = parse_uri(uri)
    assert isinstance(ref, HfURI)
    api = HfApi(endpoint=endpoint, token=token or False)  # False: not the operator's own token
    sha = api.model_info(ref.repo, revision=ref.revision, timeout=timeout).sha
    if not sha or not COMMIT.match(sha):
        raise DownloadError(errors.FAILED, f"{uri}: the Hub answered without a commit ({sha!r})")
    return sha


def _classify(uri: str, error: Exception, token: str | None, endpoint: str | None) -> DownloadError:
    """The download's failure class for `error` (runtime/model/sources/hub.py), naming the
    endpoint asked (not the operator's HF_ENDPOINT), the token never in the message."""
    from pagoda.runtime.model.sources import errors, hub
    from pagoda.runtime.model.sources.errors import DownloadError

    if isinstance(error, asyncio.TimeoutError):
        error = TimeoutError(f"no answer in time from {uri}")
    ref = parse_uri(uri)
    assert isinstance(ref, HfURI)
    found = error if isinstance(error, DownloadError) else hub.classify(ref, error)
    message = str(found)
    if found.detail == errors.UNREACHABLE:
        where = endpoint or "https://huggingface.co"
        message = f"{uri}: cannot reach {where}: {type(error).__name__}: {error}"
    if token and len(token) >= 4:
        message = message.replace(token, "<HF_TOKEN>")
    return DownloadError(found.detail, message)


def _endpoint(spec: InferenceServiceSpec, secret: Mapping[str, str]) -> str | None:
    """What the download container gets as HF_ENDPOINT: a literal in spec.env (which wins over
    the Secret's keys, as `env` wins over `envFrom`), else the Secret's, else the operator's
    own; None: the Hub."""
    for item in spec.env:
        if item.get("name") == "HF_ENDPOINT" and "valueFrom" not in item:
            return item.get("value") or None  # no value (an empty one): the Hub
    return secret.get("HF_ENDPOINT") or os.environ.get("HF_ENDPOINT") or None


async def _secret(api: KubeApi, namespace: str | None, name: str | None) -> dict[str, str]:
    """The keys of spec.modelSecretRef's Secret this needs (HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
    HF_ENDPOINT), spaces and newline dropped as huggingface_hub drops them; {} without one (a
    public repo still resolves; a missing or unreadable Secret is logged: the pods report it)."""
    if not name:
        return {}
    try:
        obj = await api.get("Secret", namespace, name)
    except ApiError as e:
        if e.transient:
            raise
        log.warning("Cannot read Secret %s/%s (HTTP %s): resolving without it", namespace, name,
                    e.status)  # fmt: skip
        return {}
    out = {}
    for key, value in ((obj or {}).get("data") or {}).items():
        if key in (*TOKEN_KEYS, "HF_ENDPOINT"):
            try:
                out[key] = base64.b64decode(value, validate=True).decode().strip()
            except (binascii.Error, UnicodeDecodeError, ValueError, TypeError):
                continue
    return out
