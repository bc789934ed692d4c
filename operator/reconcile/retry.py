"""Running a reconcile, mapping its outcome to kopf's error semantics, and retrying failures.

`Reconciler` is what the kopf handlers (handlers.py) and the background loops call: a handler's
reconcile (`run`), a child's event (`child_event`), the periodic resync (`resync_loop`) and the
autotuner's "the mounted profile changed" (`after_autotune`).

Every failed reconcile is retried with exponential backoff by the path that needed it:

* a kopf handler (create/update/resume) raises `kopf.TemporaryError(delay=…)`, and kopf retries;
  as a safety net a follow-up is also scheduled a little after kopf's retry, and skipped if any
  reconcile of that object succeeded meanwhile (kopf stores its retry state in an annotation; a
  failed PATCH of that annotation, e.g. a 409, would otherwise stall the handler until the resync);
* a child event and a resync have no kopf retry (kopf never retries event handlers), so a failure
  schedules the follow-up directly.

A follow-up re-reads the object, so it always reconciles the latest spec; at most one runs per
InferenceService; after `MAX_FOLLOW_UPS` failures in a row the periodic resync takes over. A
replica that stands by (kube/peering.py) runs none: the active one acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import kopf
from pagoda.operator.kube.client import ApiError, KubeApi
from pagoda.operator.kube.names import KIND
from pagoda.operator.reconcile import reconcile
from pagoda.operator.reconcile.apply import ChildConflict
from pagoda.operator.reconcile.pods import PodFailures
from pagoda.operator.reconcile.reconcile import StatusWriteError

if TYPE_CHECKING:
    from pagoda.operator.spec.config import OperatorConfig
    from pagoda.operator.web.metrics import OperatorMetrics

MAX_FOLLOW_UPS = 12  # 1 + 2 + 4 + … + 60 s: about 7 minutes of retries
FOLLOW_UP_MARGIN_S = 2.0  # after kopf's own retry of a handler
FIRST_SWEEP_S = 10.0  # after start-up: reconcile what kopf has not (resync_loop)
log = logging.getLogger(__name__)


def backoff(retry: int) -> float:
    """Seconds before retry number `retry` (0-based): 1, 2, 4, ... capped at a minute."""
    return min(2.0 ** max(retry, 0), 60.0)


class Reconciler:
    """`reconcile.reconcile` with kopf's error semantics, metrics and follow-up retries."""

    def __init__(
        self,
        api: KubeApi,
        config: OperatorConfig,
        metrics: OperatorMetrics | None = None,
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.config = config
        self.metrics = metrics
        self.active = active  # this replica acts (kube/peering.py): a standby's follow-ups stop
        self._follow_ups: dict[str, asyncio.Task[None]] = {}
        self._succeeded: dict[str, float] = {}  # uid → monotonic time of the last success
        self._failed: dict[str, float] = {}  # uid → monotonic time of the last failure
        self.pods = PodFailures()  # the serving pods' named failures (pod events fill it)
        self._status_warned: dict[str, tuple[int, str]] = {}  # uid → refused write's (code, reason)

    async def run(
        self, body: Mapping[str, Any], logger: logging.Logger, retry: int, trigger: str
    ) -> None:
        """Reconcile once; raise kopf.TemporaryError / PermanentError (and schedule a
        follow-up for a temporary one). `retry` > 0: kopf retries its handler (counted)."""
        if retry and trigger == "handler" and self.metrics is not None:
            self.metrics.reconcile_retries.labels(trigger).inc()
        try:
            await self._run(body, logger, retry, trigger)
        except kopf.TemporaryError as e:
            delay = (e.delay or 0.0) + (FOLLOW_UP_MARGIN_S if trigger == "handler" else 0.0)
            self.schedule(body, trigger, delay, retry + 1)
            raise

    async def _run(
        self, body: Mapping[str, Any], logger: logging.Logger, retry: int, trigger: str
    ) -> None:
        started = time.perf_counter()
        uid = body["metadata"]["uid"]
        try:
            result = await reconcile.reconcile(self.api, body, self.config, logger, self.pods)
        except ApiError as e:
            if isinstance(e, StatusWriteError) and e.refused:  # the user would see nothing else
                await self._status_refused(body, e, logger, retry, trigger)
            self._count_error(trigger, "transient" if e.transient else "permanent")
            if e.transient:
                raise kopf.TemporaryError(
                    f"Kubernetes API call failed, retrying in {backoff(retry):.0f} s: {e}",
                    delay=backoff(retry),
                ) from e
            logger.error("The API server refused a request that a retry cannot fix: %s", e)
            raise kopf.PermanentError(f"the API server refused a request: {e}") from e
        finally:
            if self.metrics is not None:
                self.metrics.reconcile_duration.labels(trigger).observe(
                    time.perf_counter() - started
                )
        err = result.spec_error
        # the garbage collector may free the name; the Hub may answer: try again
        if isinstance(err, ChildConflict) or getattr(err, "transient", False):
            self._count_error(trigger, "transient")
            if result.status_changed:
                await self._warn(body, err)
            raise kopf.TemporaryError(err.message, delay=max(backoff(retry), 10.0))
        self._succeeded[uid] = time.monotonic()
        self._status_warned.pop(uid, None)
        if err is None:
            if result.status_changed:
                logger.info("Reconciled %s %s.", KIND, body["metadata"]["name"])
            return
        if result.status_changed:
            await self._warn(body, err)
        raise kopf.PermanentError(f"{err.reason}: {err.message}")

    async def _warn(self, body: Mapping[str, Any], err: Exception) -> None:
        await self.api.try_post_event(
            body, type_="Warning", reason=getattr(err, "reason", "Error"),
            message=getattr(err, "message", str(err)), component=self.config.component_name,
        )  # fmt: skip

    async def _status_refused(
        self,
        body: Mapping[str, Any],
        err: StatusWriteError,
        logger: logging.Logger,
        retry: int,
        trigger: str,
    ) -> NoReturn:
        """A refused status write, whatever its code: an Event, and a retry with backoff."""
        self._count_error(trigger, "status")
        delay = backoff(retry)
        logger.error("The API server refused the status write (retrying in %.0f s): %s", delay, err)
        await self._warn_status(body, err)
        raise kopf.TemporaryError(
            f"the API server refused the status write, retrying in {delay:.0f} s: {err}",
            delay=delay,
        ) from err

    async def _warn_status(self, body: Mapping[str, Any], err: ApiError) -> None:
        """A Warning Event naming the refused status write's code, once per distinct refusal
        until a reconcile of the object succeeds (the retries are in the operator's log)."""
        uid = body["metadata"]["uid"]
        if self._status_warned.get(uid) == (err.status, err.reason):
            return
        self._status_warned[uid] = (err.status, err.reason)
        await self.api.try_post_event(
            body, type_="Warning", reason="StatusWriteFailed",
            message=f"The API server refused the status write (HTTP {err.status} {err.reason}): "
            f"{err.message}; retrying with backoff (1 s doubling to 60 s)",
            component=self.config.component_name,
        )  # fmt: skip

    def _count_error(self, trigger: str, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.reconcile_errors.labels(trigger, kind).inc()

    async def child_event(
        self,
        event_type: str | None,
        child: Mapping[str, Any],
        owner: Mapping[str, Any],
        logger: logging.Logger,
    ) -> None:
        """A child of `owner` changed or vanished: restore it (reconcile.on_child_event).

        kopf never retries event handlers: a failure reconciles the owner again, with backoff.
        """
        started = time.perf_counter()
        try:
            await reconcile.on_child_event(
                self.api, event_type, child, owner, self.config, logger, self.pods
            )
        except (ApiError, ChildConflict) as e:
            logger.warning(
                "Handling the %s event of %s %s failed: %s; reconciling %s %s again in %.0f s.",
                event_type, child.get("kind"), child["metadata"].get("name"), e, KIND,
                owner["metadata"]["name"], backoff(0),
            )  # fmt: skip
            status_refused = isinstance(e, StatusWriteError) and e.refused
            self._count_error("child_event", "status" if status_refused else "transient")
            if status_refused:
                await self._warn_status(owner, e)
            self.schedule(owner, "child_event", backoff(0), 1)
        finally:
            if self.metrics is not None:
                self.metrics.reconcile_duration.labels("child_event").observe(
                    time.perf_counter() - started
                )

    async def pod_event(
        self,
        event_type: str | None,
        pod: Mapping[str, Any],
        owner: Mapping[str, Any] | None,
        logger: logging.Logger,
    ) -> None:
        """A serving pod changed: a container's named failure (its termination message) that
        appears or clears changes the owner's conditions; a new one is also a Warning Event."""
        changed, new = self.pods.observe(event_type, pod)
        if owner is None or (not changed and new is None):
            return
        try:
            fresh = await reconcile.on_pods_changed(self.api, owner, self.config, self.pods)
            if fresh is not None and new is not None:
                logger.warning("%s: %s", new.reason, new.description)
                await self.api.try_post_event(
                    fresh, type_="Warning", reason=new.reason, message=new.description,
                    component=self.config.component_name,
                )  # fmt: skip
        except ApiError as e:
            logger.warning("Updating the status after a pod event failed: %s; retrying.", e)
            status_refused = isinstance(e, StatusWriteError) and e.refused
            self._count_error("pod_event", "status" if status_refused else "transient")
            if status_refused:
                await self._warn_status(owner, e)
            self.schedule(owner, "pod_event", backoff(0), 1)

    async def after_autotune(self, body: Mapping[str, Any]) -> None:
        """The autotuner changed `status.autotune`: reconcile, so the pods mount the profile."""
        await self.run(copy.deepcopy(dict(body)), log, 0, "autotune")

    async def resync_loop(self, logger: logging.Logger) -> None:
        """Re-reconcile every InferenceService periodically; heals what no event announced.

        The first pass comes `FIRST_SWEEP_S` after start-up and takes only the objects this
        process has not reconciled yet: kopf resumes an object that an earlier process left with
        a retry pending by sleeping, then PATCHing a "touch" annotation to wake itself; if that
        PATCH fails (a 409, say), nothing would handle the object until the next full resync.

        A failed reconcile is followed up with backoff (`run` schedules it), not left to the
        next resync.
        """
        await asyncio.sleep(min(FIRST_SWEEP_S, self.config.resync_interval_s))
        while not await self._sweep(logger, only_unreconciled=True):
            await asyncio.sleep(backoff(0))  # the list failed: the first pass must not wait
        while True:
            await asyncio.sleep(self.config.resync_interval_s)
            await self._sweep(logger)

    async def _sweep(self, logger: logging.Logger, *, only_unreconciled: bool = False) -> bool:
        """Reconcile the listed objects (all, or those not reconciled by this process yet);
        False when the list failed."""
        try:
            bodies = await self.api.list_all(KIND, self.config.namespaces)
        except ApiError as e:
            logger.warning("Resync could not list %s objects: %s", KIND, e)
            return False
        self.keep_only({b["metadata"]["uid"] for b in bodies})
        listed = {(b["metadata"]["namespace"], b["metadata"]["name"]) for b in bodies}
        for gone in set(self.api.status_failures) - listed:
            self.api.forget_status(*gone)
        for body in bodies:
            uid = body["metadata"]["uid"]
            follow_up = self._follow_ups.get(uid)
            if only_unreconciled and (
                uid in self._succeeded or (follow_up is not None and not follow_up.done())
            ):
                continue
            try:
                await self.run(body, logger, 0, "resync")
            except kopf.TemporaryError as e:
                logger.warning("Resync of %s: %s", body["metadata"].get("name"), e)
            except kopf.PermanentError as e:
                logger.debug("Resync of %s: %s", body["metadata"].get("name"), e)
        return True

    # --- follow-ups ----------------------------------------------------------------------------

    def schedule(self, body: Mapping[str, Any], trigger: str, delay: float, attempt: int) -> None:
        """Reconcile this object again after `delay` s unless one succeeds meanwhile."""
        meta = body["metadata"]
        self._failed[meta["uid"]] = time.monotonic()
        running = self._follow_ups.get(meta["uid"])
        if running is not None and not running.done():
            return  # one follow-up per object: it retries until a success after this failure
        ref = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind", KIND),
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid")},
        }
        self._follow_ups[meta["uid"]] = asyncio.create_task(
            self._follow_up(ref, trigger, delay, attempt), name=f"pagoda-retry-{meta['name']}"
        )

    async def _follow_up(
        self, ref: dict[str, Any], trigger: str, delay: float, attempt: int
    ) -> None:
        uid, name = ref["metadata"]["uid"], ref["metadata"]["name"]
        for n in range(attempt, attempt + MAX_FOLLOW_UPS):
            await asyncio.sleep(delay)
            if self._succeeded.get(uid, float("-inf")) > self._failed.get(uid, float("inf")):
                return  # kopf's retry (or another path) succeeded after the last failure
            if not self.active():
                log.info("%s %s: not retrying, this replica stands by.", KIND, name)
                return  # the active replica acts on it (its kopf resumed, its resync runs)
            if self.metrics is not None:
                self.metrics.reconcile_retries.labels(trigger).inc()
            try:
                await self._run(ref, log, n, trigger)
                return
            except kopf.TemporaryError as e:
                self._failed[uid] = time.monotonic()
                delay = e.delay or backoff(n)
                log.warning("Retrying %s %s in %.0f s: %s", KIND, name, delay, e)
            except kopf.PermanentError:
                return  # a condition says why; the spec or the cluster has to change
        log.warning("%s %s: giving up retrying; the resync will try again.", KIND, name)

    def keep_only(self, uids: set[str]) -> None:
        """Forget the bookkeeping of objects that no longer exist (the resync lists them)."""
        for book in (self._succeeded, self._failed, self._status_warned):
            for uid in set(book) - uids:
                del book[uid]

    async def close(self) -> None:
        for task in self._follow_ups.values():
            task.cancel()
        for task in self._follow_ups.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._follow_ups.clear()
