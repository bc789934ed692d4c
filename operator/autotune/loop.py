"""The autotuning loop, the I/O shell over keys/profiles/jobs: every `autotune_interval_s`,

1. read every InferenceService with `spec.autotune.enabled`, and the GPU products it can use;
2. per key (one per namespace, shared): make sure the profile ConfigMap exists; if it holds no
   profile, look at the key's Job: running → Tuning; suspended (a queue such as Kueue
   holds it) → TuningPending; failed or timed out → record it, post an
   Event, delete the Job, retry after `base × 2^(attempts−1)` (never a tight loop: the attempt
   count and start time live in the ConfigMap); none and not backing off → RBAC + a new Job;
3. write `status.autotune` of each service; when it changed, reconcile the service (the
   reconciler mounts a published profile: autotune/mount.py);
4. delete profile ConfigMaps no service uses (their Job/ServiceAccount/Role/RoleBinding go with
   them through owner references).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.operator.autotune import jobs, mount, profiles
from pagoda.operator.autotune.keys import (
    PRODUCT_LABEL,
    SeenProducts,
    TuneKey,
    checked_at,
    dump_seen,
    key_for,
    load_seen,
    products_for,
    selection,
    steady_products,
)
from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.names import KIND, RESOURCES
from pagoda.operator.spec import validation
from pagoda.operator.spec.fields import SpecError

if TYPE_CHECKING:
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.spec.inference_service import InferenceServiceSpec

log = logging.getLogger(__name__)
TUNING, TUNED, FAILED = "Tuning", "Tuned", "TuningFailed"
PENDING = "TuningPending"  # the Job is suspended (a queue has not admitted it) or waits for a pin
JOB_NOT_CREATED = "JobNotCreated"  # the API server refused the Job (or its RBAC)
Reconcile = Callable[[Mapping[str, Any]], Awaitable[None]]
# (body, spec, config) → the spec with status.model's pin of an hf:// branch, None while it
# needs one not recorded yet (reconcile/model_pin.py's `recorded_model_spec`: adapters' pins do
# not matter to a Job that measures the base model; autotune/ is below it)
Pin = Callable[[Mapping[str, Any], "InferenceServiceSpec", "OperatorConfig"],
               "InferenceServiceSpec | None"]  # fmt: skip
NOT_PINNED = "ModelNotPinned"
DEFAULT_SERVICE_ACCOUNT = "default"  # the serving pods' (no serviceAccountName): its pull secrets


@dataclass(frozen=True)
class KeyState:
    state: str
    reason: str
    message: str
    data_hash: str | None = None


@dataclass
class Tick:
    """What one pass learned (shared keys are looked at once)."""

    nodes: list[dict[str, Any]] | None = None
    states: dict[tuple[str, str], KeyState] = field(default_factory=dict)
    wanted: set[tuple[str, str]] = field(default_factory=set)
    unsure: set[str] = field(default_factory=set)  # namespaces not to garbage-collect
    specs: list[tuple[str, InferenceServiceSpec]] = field(default_factory=list)  # autotuned
    seen: dict[tuple[Any, ...], SeenProducts] = field(default_factory=dict)  # next pass's memory


class Autotuner:
    def __init__(
        self,
        api: KubeApi,
        config: OperatorConfig,
        reconcile: Reconcile,
        pod_parts: jobs.PodParts | None = None,
        pin: Pin | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.reconcile = reconcile
        self.pod_parts = pod_parts  # what the model adds to a pod (jobs.build_job)
        self.pin = pin  # the tuning Job measures the commit the pods serve
        self.clock: Callable[[], float] = time.time
        # per service and node selection: its node-derived GPU products (keys.steady_products),
        # saved in status.autotune.nodeProducts and read back by a fresh process (a take-over)
        self._seen: dict[tuple[Any, ...], SeenProducts] = {}

    def forget_all(self) -> None:
        """Start afresh, as after a restart (a replica that becomes the active one again): each
        service's products are read back from its status at the next pass."""
        self._seen.clear()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.autotune_interval_s)
            try:
                await self.tick()
            except ApiError as e:
                log.warning("Autotune pass failed (next pass in %.0f s): %s",
                            self.config.autotune_interval_s, e)  # fmt: skip
            except Exception:  # never let one bad pass end autotuning for good
                log.exception("Autotune pass failed (next pass in %.0f s)",
                              self.config.autotune_interval_s)  # fmt: skip

    async def tick(self) -> None:
        t = Tick()
        for body in await self.api.list_all(KIND, self.config.namespaces):
            try:
                await self._service(t, body)
            except ApiError as e:
                t.unsure.add(body["metadata"]["namespace"])
                log.warning("Autotune of %s: %s", body["metadata"]["name"], e)
        # services gone or edited are forgotten; a namespace whose pass failed keeps its memory
        kept = {k: v for k, v in self._seen.items() if k[0] in t.unsure}
        self._seen = {**kept, **t.seen}
        await self._collect(t)

    async def _service(self, t: Tick, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        try:
            spec = validation.parse(body, self.config)
        except SpecError:
            t.unsure.add(ns)  # its keys are unknown: keep every profile there
            return
        if not spec.autotune.enabled:
            if (body.get("status") or {}).get("autotune") is not None:
                await self._write(body, None)
            return
        t.specs.append((ns, spec))
        with_pin = spec if self.pin is None else self.pin(body, spec, self.config)
        products, node_products = await self._products(t, body, spec)
        keys = [key_for(spec, p) for p in products]
        states = []
        for key in keys:
            t.wanted.add((ns, key.profile_name))
            seen = t.states.get((ns, key.profile_name))
            # a key shared with a service whose pin is not recorded yet: this one's may start it
            if seen is None or (seen.reason == NOT_PINNED and with_pin is not None):
                t.states[ns, key.profile_name] = await self._key(key, spec, with_pin, ns)
            states.append(t.states[ns, key.profile_name])
        status = service_status(keys, states)
        if node_products is not None:
            status["nodeProducts"] = node_products
        await self._write(body, status)

    async def _products(
        self, t: Tick, body: Mapping[str, Any], spec: InferenceServiceSpec
    ) -> tuple[list[str], dict[str, Any] | None]:
        """The GPU products to tune for: a pinned one, else the nodes' through a blink's grace;
        and the memory of them to save (status.autotune.nodeProducts; None: nothing to keep)."""
        if any(k == PRODUCT_LABEL for k, _ in spec.node_selector):
            return products_for(spec, ()), None
        if t.nodes is None:
            t.nodes = await self.api.list("Node")
        meta = body["metadata"]
        # an edit of what selects the nodes starts afresh (its products count at once)
        where = (meta["namespace"], meta["name"], spec.node_selector, spec.resources.gpus)
        now, digest = self.clock(), selection(spec)
        memory = self._seen.get(where)
        refresh = self._refresh_s()
        if memory is None:  # a fresh process: what the last one saw, its last pass an interval
            # ago, or (all replicas were down) within `refresh` of the saved `checked`
            saved = ((body.get("status") or {}).get("autotune") or {}).get("nodeProducts")
            memory = load_seen(saved, digest, now - self.config.autotune_interval_s, refresh)
        memory = memory or SeenProducts()
        products, seen = steady_products(
            memory, products_for(spec, t.nodes), now, self.config.autotune_product_grace_s
        )
        t.seen[where] = dataclasses.replace(seen, checked=checked_at(memory.checked, now, refresh))
        return products, dump_seen(t.seen[where], now, digest)

    def _refresh_s(self) -> float:
        """How often a pass confirms a service's saved products' memory (`checked`): a tenth of
        the grace, at least one pass (a product that went while no operator ran is held at
        most that much beyond its grace)."""
        c = self.config
        return max(c.autotune_interval_s, c.autotune_product_grace_s / 10)

    # --- one key ------------------------------------------------------------------------------

    async def _key(
        self,
        key: TuneKey,
        spec: InferenceServiceSpec,
        with_pin: InferenceServiceSpec | None,
        ns: str,
    ) -> KeyState:
        """`with_pin`: `spec` with its hf:// model pinned (None: not pinned yet, no Job starts;
        the commit is not part of the key: it changes the weights, not the shapes measured)."""
        cm = await self._profile_config_map(key, ns)
        if profiles.is_tuned(cm):
            return _published(key, cm)
        attempts = profiles.Attempts.of(cm)
        job = await self.api.get("Job", ns, key.job_name)
        if job is not None and not _owned_by(job, cm):
            await self.api.delete("Job", ns, key.job_name)  # left from an older ConfigMap
            return KeyState(TUNING, "JobReplaced", "an old tuning Job is being removed")
        outcome, reason, message = jobs.job_outcome(job)
        if outcome == "running":
            return KeyState(TUNING, "JobRunning", f"Job {key.job_name}, attempt {attempts.count}")
        if outcome == "suspended":
            what = f"Job {key.job_name}, attempt {attempts.count}, is suspended"
            return KeyState(PENDING, reason, f"{what} ({message}); serving on defaults meanwhile")
        if outcome == "succeeded":
            cm = await self.api.get("ConfigMap", ns, key.profile_name)
            if profiles.is_tuned(cm):
                assert cm is not None
                return _published(key, cm)
            outcome, reason, message = "failed", "NoProfilePublished", "the Job published nothing"
        if outcome == "failed":
            return await self._failed(key, ns, attempts, reason, message)
        now = self.clock()
        if profiles.in_future(attempts, now):
            await self.api.patch(
                "ConfigMap", ns, key.profile_name, profiles.failure_time_patch(now)
            )
            attempts = dataclasses.replace(attempts, failed=now)
        if now < attempts.retry_at(self.config.autotune_retry_base_s):
            return self._waiting(attempts)
        if with_pin is None:
            return KeyState(PENDING, NOT_PINNED, f"waiting for status.model to pin "
                            f"{spec.model.uri} to a commit, so that the Job measures the one "
                            "the pods serve; serving on defaults meanwhile")  # fmt: skip
        try:
            await self._start(key, with_pin, ns, cm, attempts)
        except ApiError as e:  # RBAC or the Job refused: the cause goes to the status and Event
            if e.status == 0:
                raise  # unreachable: the failure cannot be recorded either; the next pass retries
            return await self._not_started(key, ns, attempts, e)
        return KeyState(TUNING, "JobStarted", f"Job {key.job_name}, attempt {attempts.count + 1}")

    def _waiting(self, attempts: profiles.Attempts) -> KeyState:
        """Backing off after a failed attempt: its cause, and when the next one starts (a time,
        not a countdown, so the message changes once per attempt, not once per pass)."""
        failure = attempts.failure or f"attempt {attempts.count} ended without a result"
        at = _iso(attempts.retry_at(self.config.autotune_retry_base_s))
        return KeyState(
            FAILED, _reason(failure), f"{failure}; attempt {attempts.count + 1} at {at}"
        )

    async def _profile_config_map(self, key: TuneKey, ns: str) -> dict[str, Any]:
        cm = await self.api.get("ConfigMap", ns, key.profile_name)
        if cm is not None:
            return cm
        try:
            return await self.api.create(profiles.build_profile_config_map(key, ns))
        except ApiError as e:
            if e.status != 409:
                raise
        cm = await self.api.get("ConfigMap", ns, key.profile_name)
        if cm is None:
            raise ApiError(409, "Conflict", f"ConfigMap {key.profile_name} came and went")
        return cm

    async def _start(self, key: TuneKey, spec: InferenceServiceSpec, ns: str,
                     cm: Mapping[str, Any], attempts: profiles.Attempts) -> None:  # fmt: skip
        # recorded first: whatever happens to the RBAC or the Job, the next start waits its backoff
        await self.api.patch("ConfigMap", ns, key.profile_name,
                             profiles.start_patch(attempts, self.clock()))  # fmt: skip
        secrets = await self._pull_secrets(ns)
        job = jobs.build_job(key, spec, ns, cm, pod_parts=self.pod_parts, pull_secrets=secrets)
        for obj in [*jobs.build_rbac(key, ns, cm), job]:
            try:
                await self._create(obj)
            except ApiError as e:
                what = f"creating {obj['kind']} {ns}/{obj['metadata']['name']}"
                raise ApiError(e.status, e.reason, f"{what}: {e.message}") from e
        log.info("Started tuning Job %s/%s for %s.", ns, key.job_name, key.describe())

    async def _pull_secrets(self, ns: str) -> list[dict[str, Any]]:
        """The `imagePullSecrets` of the namespace's `default` ServiceAccount, the serving pods'
        (none when it has none, is missing, or the operator may not read it: an older chart)."""
        try:
            sa = await self.api.get("ServiceAccount", ns, DEFAULT_SERVICE_ACCOUNT)
        except ApiError as e:
            if e.status != 403:
                raise
            log.warning("Cannot read ServiceAccount %s/%s (forbidden): the tuning Job gets no "
                        "imagePullSecrets.", ns, DEFAULT_SERVICE_ACCOUNT)  # fmt: skip
            return []
        return [dict(s) for s in (sa or {}).get("imagePullSecrets") or [] if s.get("name")]

    async def _not_started(self, key: TuneKey, ns: str, attempts: profiles.Attempts,
                           error: ApiError) -> KeyState:  # fmt: skip
        """Attempt `attempts.count + 1` could not create its objects: recorded as its failure."""
        now = self.clock()
        message = f"HTTP {error.status} {error.reason}, {error.message}"
        await self.api.patch("ConfigMap", ns, key.profile_name,
                             profiles.failure_patch(JOB_NOT_CREATED, message, now))  # fmt: skip
        seen = profiles.Attempts(
            attempts.count + 1, now, f"{JOB_NOT_CREATED}: {message}"[:1024], now
        )
        state = self._waiting(seen)
        log.warning("Tuning Job %s/%s not started: %s", ns, key.job_name, state.message)
        return state

    async def _failed(self, key: TuneKey, ns: str, attempts: profiles.Attempts,
                      reason: str, message: str) -> KeyState:  # fmt: skip
        now = self.clock()
        await self.api.patch("ConfigMap", ns, key.profile_name,
                             profiles.failure_patch(reason, message, now))  # fmt: skip
        await self.api.delete("Job", ns, key.job_name)
        seen = profiles.Attempts(
            attempts.count, attempts.started, f"{reason}: {message}"[:1024], now
        )
        state = self._waiting(seen)
        log.warning("Tuning Job %s/%s failed: %s", ns, key.job_name, state.message)
        return state

    async def _create(self, obj: Mapping[str, Any]) -> None:
        try:
            await self.api.create(obj)
        except ApiError as e:
            if e.status != 409:
                raise

    # --- status, events, garbage collection ---------------------------------------------------

    async def _write(self, body: Mapping[str, Any], new: dict[str, Any] | None) -> None:
        """Write status.autotune when it changed; a new failure (each failed attempt: its message
        names the cause and the next attempt) is also a Warning Event; reconcile when more than
        the message changed (the profile to mount may have)."""
        old = (body.get("status") or {}).get("autotune")
        if old == new:
            return
        meta = body["metadata"]
        patch = new if new is None or old is None else {**dict.fromkeys(old), **new}
        await self.api.patch(KIND, meta["namespace"], meta["name"], {"status": {"autotune": patch}},
                             subresource="status")  # fmt: skip
        state, was = (new or {}).get("state"), old or {}
        failed_anew = state == FAILED and (new or {}).get("message") != was.get("message")
        if state in (FAILED, TUNED) and (state != was.get("state") or failed_anew):
            assert new is not None
            await self.api.try_post_event(
                body, type_="Warning" if state == FAILED else "Normal", reason=state,
                message=new["message"], component=self.config.component_name,
            )  # fmt: skip
        if _same(old, new):
            return  # only the message: nothing to mount or unmount
        try:
            await self.reconcile(body)  # mount (or unmount) the profile
        except Exception as e:  # the reconciler retries on its own; this pass goes on
            log.info("Reconcile after an autotune change of %s: %s", meta["name"], e)

    async def _collect(self, t: Tick) -> None:
        for cm in await self._profile_config_maps():
            meta = cm["metadata"]
            where = (meta["namespace"], meta["name"])
            if not profiles.is_profile(cm) or where in t.wanted or meta["namespace"] in t.unsure:
                continue
            if _still_used(cm, t.specs):
                continue  # a tuned profile of a GPU type its service's nodes do not show now
            if await self.api.delete("ConfigMap", *where):
                log.info("Deleted tuned profile %s/%s: no %s uses it.", *where, KIND)

    async def _profile_config_maps(self) -> list[dict[str, Any]]:
        """Profile ConfigMaps in the served namespaces (server-side label selector; the labels
        are checked again by the caller, for API servers that ignore the selector)."""
        res = RESOURCES["ConfigMap"]
        selector = ",".join(f"{k}={v}" for k, v in profiles.profile_labels().items())
        items: list[dict[str, Any]] = []
        for ns in self.config.namespaces or (None,):
            data = await self.api.request("GET", res.path(ns), params={"labelSelector": selector})
            items += (data or {}).get("items") or []
        return items


def _published(key: TuneKey, cm: Mapping[str, Any]) -> KeyState:
    """A ConfigMap holding a profile: Tuned, or TuningFailed when serving could not use it (no
    retry: the same Job would publish the same; deleting the ConfigMap re-tunes)."""
    problem = mount.profile_problem(cm, key.model)
    if problem is None:
        return KeyState(TUNED, "ProfilePublished", key.describe(), profiles.data_hash(cm))
    reason, message = problem
    name = cm["metadata"]["name"]
    return KeyState(FAILED, reason, f"{message}; serving on defaults (delete ConfigMap {name} "
                                    "to tune again)")  # fmt: skip


def service_status(keys: list[TuneKey], states: list[KeyState]) -> dict[str, Any]:
    """status.autotune of one service from the states of its keys."""
    if not keys:
        return {"state": FAILED, "reason": "NoGPUNodes",
                "message": "no node with a GPU product label matches this service"}  # fmt: skip
    entries = [
        {"product": k.product, "configMap": k.profile_name, "state": s.state,
         **({"hash": s.data_hash} if s.data_hash else {})}
        for k, s in zip(keys, states)
    ]  # fmt: skip
    worst = next(
        (s for rank in (FAILED, PENDING, TUNING) for s in states if s.state == rank), states[0]
    )
    out: dict[str, Any] = {"state": worst.state, "reason": worst.reason, "message": worst.message}
    if len(keys) == 1:
        out.update(product=keys[0].product, profile=keys[0].profile_name)
    else:
        out["message"] += (f"; {len(keys)} GPU products: pin one with spec.nodeSelector"
                           f"[{jobs.PRODUCT_LABEL}] to mount its profile")  # fmt: skip
    out["profiles"] = entries
    return out


def _iso(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def _reason(text: str | None) -> str:
    word = (text or "TuningFailed").split(":", 1)[0]
    return word if word[:1].isupper() and word.isalnum() else "TuningFailed"


def _still_used(cm: Mapping[str, Any], specs: list[tuple[str, InferenceServiceSpec]]) -> bool:
    """A tuned profile that a service of its namespace would mount on its GPU product: kept
    while its nodes are away (scaled to zero, relabelled), so they come back to it, not to a
    new tuning Job."""
    if not profiles.is_tuned(cm):
        return False
    meta = cm["metadata"]
    product = profiles.key_product(cm)
    return product is not None and any(
        ns == meta["namespace"] and key_for(spec, product).profile_name == meta["name"]
        for ns, spec in specs
    )


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = owner["metadata"].get("uid")
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


def _same(old: Any, new: Any) -> bool:
    """Equal apart from volatile message text ("retry in N s") and the products' memory."""

    def strip(v: Any) -> Any:
        volatile = ("message", "nodeProducts")  # the products' memory mounts nothing by itself
        return {k: x for k, x in v.items() if k not in volatile} if isinstance(v, dict) else v

    return strip(old) == strip(new)
