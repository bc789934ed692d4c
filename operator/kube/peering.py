"""Which replica is active: kopf peering, read back for the parts kopf does not pause.

With `--peering NAME` several replicas run; each keeps its record (priority, lifetime,
lastseen) in the status of the ClusterKopfPeering NAME (cluster-wide) or the KopfPeering NAME
of every served namespace, and kopf pauses the handlers of every replica that sees a live peer
of a higher priority, or of the same one (then all of them pause: no replica may share a
priority). Kopf pauses its watches only: the operator's own loops (resync, autoscaler,
autotuner) and POST /alerts are ours to pause. `PeeringGate` reads the same records every
`interval_s` and applies kopf's rule (`is_active`, kopf 1.45's `process_peering_event`), so
those run on the replica whose handlers run, and labels its pod
`serving.pagoda.dev/peering=active` (the chart's Service selects it: Alertmanager reaches the
active replica only).

Priorities (`auto_priority`): an earlier start is a higher priority, so a replica that starts
later (a rollout's new pod, a restarted one) waits as the standby instead of taking over;
the active one leaves (SIGTERM: kopf removes its record at once) or dies (its record expires
`lifetime` seconds after its last keep-alive) and the standby takes over.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from pagoda.operator.kube.client import ApiError, KubeApi

PEERING_LABEL = "serving.pagoda.dev/peering"  # on the operator's pod: active | standby
KOPF_LIFETIME_DEFAULT_S = 60  # what kopf assumes of a record without a lifetime
log = logging.getLogger(__name__)


def auto_priority(now_s: float | None = None, tiebreak: int | None = None) -> int:
    """An earlier start is a higher priority: −(ms since the epoch × 1000 + 0..999).

    Distinct for replicas that start in different milliseconds, and by the random tiebreak
    almost surely for those that do not; within ±2^53 (exact in every JSON reader)."""
    ms = int((time.time() if now_s is None else now_s) * 1000)
    return -(ms * 1000 + (random.randrange(1000) if tiebreak is None else tiebreak))


def default_identity() -> str:
    """This process in the peering records when POD_NAME is unset (kopf's own style)."""
    return f"{socket.gethostname()}/{random.randrange(16**6):06x}"


def _parse_time(raw: Any) -> datetime.datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)


def live_peers(
    status: Mapping[str, Any] | None, identity: str, now: datetime.datetime
) -> dict[str, int]:
    """{identity: priority} of the other replicas whose record has not expired."""
    peers: dict[str, int] = {}
    for peer, record in (status or {}).items():
        if peer == identity or not isinstance(record, Mapping):
            continue
        seen = _parse_time(record.get("lastseen")) or now
        lifetime = record.get("lifetime", KOPF_LIFETIME_DEFAULT_S)
        try:
            alive = seen + datetime.timedelta(seconds=int(lifetime)) > now
            priority = int(record.get("priority", 0))
        except (TypeError, ValueError):
            continue
        if alive:
            peers[peer] = priority
    return peers


def is_active(
    status: Mapping[str, Any] | None, identity: str, priority: int, now: datetime.datetime
) -> bool:
    """kopf's rule: paused while a live peer has a higher or the same priority."""
    return all(p < priority for p in live_peers(status, identity, now).values())


class PeeringGate:
    """`active` says whether this replica is the one that acts; `run()` keeps it current.

    Stricter than kopf in one way: a replica acts only while its own record is there (kopf
    writes it right after start-up) and alive, so two replicas that start together do not both
    run the loops for a moment before they see each other's records, and one whose keep-alives
    fail stands by when the others count it as gone.

    Without peering (`name` None) it is always active and `run()` only returns. The peering
    object missing (or unreadable) counts as not active, as kopf stays paused without it.
    """

    def __init__(
        self,
        api: KubeApi | None,
        *,
        name: str | None,
        namespaces: Iterable[str] = (),
        identity: str = "",
        priority: int = 0,
        interval_s: float = 2.0,
        lifetime_s: float = 15.0,
        pod: tuple[str, str] | None = None,
        on_change: Callable[[bool], None] = lambda active: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.name, self.identity, self.priority = api, name, identity, priority
        self.namespaces = tuple(namespaces)
        self.interval_s, self.lifetime_s, self._clock = interval_s, lifetime_s, clock
        # until when (on `clock`) the others count this replica's record alive, as of the last
        # complete read of the records: a failed read keeps the role until then
        self._alive_until = clock() + lifetime_s
        self.pod = pod  # (namespace, name) of our pod, labelled with the role
        self._on_change = on_change
        self._changed = asyncio.Event()
        self.active = name is None
        self._labelled: bool | None = None  # the role last written to the pod
        self._last_problem: str | None = None
        self._label_failed = False

    async def check(self) -> bool:
        """Read the peering record(s) once; update `active` (and the pod's label).

        A failed read keeps the role (an API blip must not cost the active replica its loops
        and the autoscaler its history) until its own record, as last read, expires (at most
        `lifetime_s` after that read): then the others count it as gone (its keep-alives
        fail too) and one of them acts, so this one stands by."""
        try:
            bodies = await self._read()
        except ApiError as e:
            keep = self.active and self._clock() < self._alive_until
            how = f"active for up to {self.lifetime_s:g} s" if keep else "standing by"
            self._problem(f"Cannot read the peering record of {self.name}: {e} ({how}).")
            active = keep
        else:
            now = datetime.datetime.now(datetime.timezone.utc)
            # Joined first: until kopf's first keep-alive is there, a peer that started at the
            # same moment may not have written its record yet either.
            statuses = [(body or {}).get("status") or {} for body in bodies]
            left = [self._record_left(status.get(self.identity), now) for status in statuses]
            self._alive_until = self._clock() + min(left, default=self.lifetime_s)
            # ... and alive: a record the others count as expired (its keep-alives failed) lets
            # one of them act
            active = all(
                body is not None
                and ttl > 0
                and is_active(status, self.identity, self.priority, now)
                for body, status, ttl in zip(bodies, statuses, left)
            )
        self._set_active(active)
        await self._label(active)
        return active

    def _record_left(self, record: Any, now: datetime.datetime) -> float:
        """Seconds until the others count our `record` expired (at most `lifetime_s`; 0 when
        it is absent or unreadable)."""
        if not isinstance(record, Mapping):
            return 0.0
        seen = _parse_time(record.get("lastseen"))
        try:
            lifetime = min(self.lifetime_s, int(record.get("lifetime", KOPF_LIFETIME_DEFAULT_S)))
        except (TypeError, ValueError):
            return 0.0
        if seen is None:
            return lifetime
        return max(0.0, lifetime - (now - seen).total_seconds())

    def _set_active(self, active: bool) -> None:
        """Take the role `active` gives (logged, the callback told, waiters woken) if new."""
        if active != self.active:
            log.info("Peering: this replica is now %s.", "active" if active else "standby")
            self.active = active
            self._on_change(active)
            self._changed.set()

    async def _read(self) -> list[dict[str, Any] | None]:
        """The ClusterKopfPeering, or the KopfPeering of every served namespace (None: absent)."""
        assert self.api is not None and self.name is not None
        where = [("ClusterKopfPeering", None)] if not self.namespaces else []
        where += [("KopfPeering", ns) for ns in self.namespaces]
        bodies = []
        for kind, ns in where:
            body = await self.api.get(kind, ns, self.name)
            if body is None:
                place = f"in {ns}" if ns else "(cluster-wide)"
                self._problem(f"No {kind} {self.name} {place}: kopf stays paused without it.")
            bodies.append(body)
        if all(body is not None for body in bodies):
            self._problem(None)
        return bodies

    def _problem(self, message: str | None) -> None:
        """Log a problem with the peering object once, until it is gone."""
        if message is not None and message != self._last_problem:
            log.warning("%s", message)
        self._last_problem = message

    async def _label(self, active: bool) -> None:
        if self.pod is None or self._labelled is active or self.api is None:
            return
        ns, name = self.pod
        patch = {"metadata": {"labels": {PEERING_LABEL: "active" if active else "standby"}}}
        try:
            await self.api.patch("Pod", ns, name, patch)
        except ApiError as e:  # tried again at the next check, logged once
            if not self._label_failed:
                log.warning("Cannot label the pod %s/%s with its peering role: %s", ns, name, e)
            self._labelled, self._label_failed = None, True
            return
        self._labelled, self._label_failed = active, False

    async def run(self) -> None:
        """Check every `interval_s` until cancelled (returns at once without peering)."""
        if self.name is None:
            return
        while True:
            try:
                await self.check()
            except Exception:  # never let one bad read end the gate: stand by instead
                log.exception("Peering check failed (standing by)")
                self._set_active(False)
            await asyncio.sleep(self.interval_s)

    async def _wait_for(self, active: bool) -> None:
        while self.active is not active:
            self._changed.clear()
            await self._changed.wait()

    async def while_active(
        self, start: Callable[[], Mapping[str, Awaitable[None]]], logger: logging.Logger = log
    ) -> None:
        """Run the loops `start()` makes while this replica is active; cancel them when it
        stands by, and make them afresh (a new `start()`) when it is active again."""
        while True:
            await self._wait_for(True)
            tasks = [asyncio.create_task(c, name=n) for n, c in start().items()]
            logger.info("Started %s.", ", ".join(t.get_name() for t in tasks))
            try:
                await self._wait_for(False)
            finally:
                await cancel_all(tasks)
            logger.info("Standing by: stopped %s.", ", ".join(t.get_name() for t in tasks))


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel and await each task; a loop that had died is logged, never raised."""
    for task in tasks:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("Background loop %s had failed", task.get_name())
