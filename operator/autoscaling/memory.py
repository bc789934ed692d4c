"""What the autoscaler remembers of a service, saved in `status.autoscaling.state`. Pure.

The policy's memory between evaluations (policy.py: the recommendations of the stabilization
windows, the demand floor's learned correction, the burst floor's samples and bursts) and the
last scale up (the alerts' cooldown) live in the active replica. Saved with each decision's
status write and read back by the replica that takes over (kube/peering.py) or by a restarted
operator, a failover neither restarts the scale-down window nor makes the burst floor forget.
`dump` keeps what the decisions need, `load` makes it again on another process's clock:

* **Recommendations.** A window takes the highest (scale down) or lowest (scale up) of its
  recommendations; of a run of equal ones only the last matters (it leaves the window last),
  and of those only the ones no later one equals or outranks either way. The run going on is
  saved by its value and its start; `load` takes it to have gone on until now (the gap of a
  failover counts as that recommendation), so a scale down that was due stays due. A run that
  asks for fewer replicas than run and started more than a scale-down window plus `MAX_GAP_S`
  ago is not a live autoscaler's (it would have scaled down): the state is stale (the operator
  was away), so the current count is recorded too, as after a restart without state.
* **Burst samples.** The burst floor holds the window's largest need while two onsets (a sample
  above the onset ratio after one below) fall within it: the samples that no later one equals
  or outranks (at most `MAX_PEAKS`, merged upwards: a merged pair keeps the higher need until
  the later time), the last `MIN_ONSETS` onsets with the sample before each, and the newest
  sample (on load, at now). Only an onset pair's first sample reads "below the ratio", so no
  other pair reads as an onset. A young service's margin (bursts.young_need) uses the mean
  need since its first traffic: from the kept samples it reads higher (the burstiness lower)
  than the full history's until the service is one window old.
* **Bursts remembered.** The last two (the next scheduled one is expected from them).
* The first traffic is `status.autoscaling.trafficSince` (loop.py), not here.

Times are wall-clock seconds (the processes' monotonic clocks differ), from a fixed offset
per process, to 0.1 s; needs to 0.001 replica; the correction to 1 %. The dict changes only
when what the decisions read changes: a service at rest is not written again. `VERSION` marks
the layout; `load` ignores any other (an older or newer operator starts afresh instead).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling.bursts import MIN_ONSETS, Bursts, Sample

if TYPE_CHECKING:
    from pagoda.operator.autoscaling.policy import History, Policy

VERSION = 1
MAX_GAP_S = 60.0  # a saved run older than the down window by more than this is stale
MAX_RECOMMENDATIONS = 64  # saved recommendations (the oldest go first)
MAX_PEAKS = 24  # saved burst peaks (adjacent ones merged upwards)


@dataclass(frozen=True)
class Memory:
    """The autoscaler's memory of one service on the loop's monotonic clock."""

    history: History
    correction: float = 1.0
    bursts: Bursts = field(default_factory=Bursts)
    last_scale_up: float | None = None


def _t(t: float, offset: float) -> float:
    return round(t + offset, 1)


def _runs(history: History) -> tuple[list[tuple[float, int]], int, float | None]:
    """The last recommendation of each completed run, the current run's value, and its start
    (None: it fills the whole remembered history)."""
    last = history[-1][1]
    ends = [(t, r) for (t, r), nxt in itertools.pairwise(history) if nxt[1] != r]
    changed = [i for i in range(len(history)) if history[i][1] != last]
    return ends, last, history[changed[-1] + 1][0] if changed else None


def _outranking(ends: list[tuple[float, int]], last: int) -> list[tuple[float, int]]:
    """The ends no later recommendation (the current run's `last` included) equals or outranks
    in either direction: a later one that does leaves every window later."""
    kept, high, low = [], last, last
    for t, r in reversed(ends):
        if r > high or r < low:
            kept.append((t, r))
            high, low = max(high, r), min(low, r)
    return kept[::-1][-MAX_RECOMMENDATIONS:]


def _peaks(samples: list[Sample], high: float) -> list[tuple[float, float]]:
    """(time, need) of the samples no later one (nor `high`, the newest's need) equals or
    outranks, merged upwards to `MAX_PEAKS` (the pair closest in need becomes the higher need
    until the later time)."""
    peaks: list[tuple[float, float]] = []
    for t, need, _ in reversed(samples):
        if need > high:
            peaks.append((t, need))
            high = need
    peaks.reverse()
    while len(peaks) > MAX_PEAKS:
        i = min(range(len(peaks) - 1), key=lambda j: peaks[j][1] - peaks[j + 1][1])
        peaks[i : i + 2] = [(peaks[i + 1][0], peaks[i][1])]
    return peaks


def _samples(samples: tuple[Sample, ...]) -> tuple[list[list[Any]], list[Any] | None]:
    """The saved burst samples ([time, need, above]) and the newest ([need, above])."""
    if not samples:
        return [], None
    *older, newest = samples
    rises = [i for i in range(1, len(samples)) if samples[i][2] and not samples[i - 1][2]]
    pairs = {j for i in rises[-MIN_ONSETS:] for j in (i - 1, i)} - {len(samples) - 1}
    kept = {(samples[j][0], samples[j][1]): samples[j][2] for j in sorted(pairs)}
    for t, need in _peaks(older, newest[1]):
        kept.setdefault((t, need), True)  # only an onset's sample before reads "below"
    saved = [[t, round(need, 3), above] for (t, need), above in sorted(kept.items())]
    return saved, [round(newest[1], 3), newest[2]]


def dump(memory: Memory, offset: float) -> dict[str, Any]:
    """The saved form (JSON) of `memory`; `offset`: wall-clock minus monotonic seconds."""
    ends, last, start = _runs(memory.history) if memory.history else ([], None, None)
    out: dict[str, Any] = {"version": VERSION}
    if last is not None:
        out["recommendations"] = [[_t(t, offset), r] for t, r in _outranking(ends, last)]
        out["recommending"] = [last] if start is None else [last, _t(start, offset)]  # no nulls
    if round(memory.correction, 2) != 1.0:
        out["correction"] = round(memory.correction, 2)
    samples, newest = _samples(memory.bursts.samples)
    if samples:
        out["samples"] = [[_t(t, offset), need, above] for t, need, above in samples]
    if newest is not None:
        out["newest"] = newest
    if memory.bursts.onsets:
        out["bursts"] = [[_t(t, offset), round(n, 3)] for t, n in memory.bursts.onsets[-2:]]
    if memory.last_scale_up is not None:
        out["lastScaleUp"] = _t(memory.last_scale_up, offset)
    return out


def load(
    raw: Any,
    *,
    now: float,
    offset: float,
    current: int,
    policy: Policy,
    since: float | None = None,
) -> Memory | None:
    """The memory `dump` saved, on this process's clock (`offset`: its wall minus monotonic
    seconds); None when absent, of another version, or unreadable. `current`: the replicas
    running now; `since`: the first traffic (trafficSince) on this clock."""
    if not isinstance(raw, Mapping) or raw.get("version") != VERSION:
        return None
    try:
        return _load(raw, now, offset, current, policy, since)
    except (TypeError, ValueError, KeyError, IndexError):
        return None


def _load(
    raw: Mapping[str, Any],
    now: float,
    offset: float,
    current: int,
    policy: Policy,
    since: float | None,
) -> Memory:
    def mono(t: Any) -> float:
        return min(now, float(t) - offset)  # a clock ahead of ours: no later than now

    history = [(mono(t), int(r)) for t, r in raw.get("recommendations") or ()]
    if raw.get("recommending") is not None:
        last, *rest = raw["recommending"]
        start = rest[0] if rest else None
        if start is not None:  # outranked by the next: changes no window, keeps the run's start
            history.append((mono(start), int(last)))
        history.append((now, int(last)))
        stale = start is None or now - mono(start) > policy.down_window_s + MAX_GAP_S
        if int(last) < current and stale:
            history.append((now, current))
    else:
        history.append((now, current))
    samples = [(mono(t), float(n), bool(a)) for t, n, a in raw.get("samples") or ()]
    if raw.get("newest") is not None:
        need, above = raw["newest"]
        samples.append((now, float(need), bool(above)))
    onsets = tuple((mono(t), float(n)) for t, n in raw.get("bursts") or ())
    up = raw.get("lastScaleUp")
    correction = float(raw.get("correction", 1.0))
    if not 0 < correction < float("inf"):
        raise ValueError(f"correction {correction}")
    return Memory(
        history=tuple(history),
        correction=correction,
        bursts=Bursts(tuple(samples), onsets, since),
        last_scale_up=None if up is None else mono(up),
    )
