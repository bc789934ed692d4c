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
  saved by its value and its start; `load` takes it to have gone on until the evaluation before
  now (`interval_s` before: the loops of all replicas evaluate on one wall-clock grid, so after
  a handover quicker than an interval that is the saving process's last evaluation, and a
  take-over at the next evaluation's time decides as the saving process would have; the rest of
  a longer gap counts as that recommendation), so a scale down that was due stays due. A run that
  asks for fewer replicas than run and started more than a scale-down window plus `MAX_GAP_S`
  ago is not a live autoscaler's (it would have scaled down): the state is stale (the operator
  was away), so the current count is recorded too, as after a restart without state.
* **Burst samples.** The burst floor holds the window's largest need while two onsets (a sample
  above the onset ratio after one below) fall within it: the samples that no later one equals
  or outranks (at most `MAX_PEAKS`, merged upwards: a merged pair keeps the higher need until
  the later time), the last `MIN_ONSETS` onsets with the sample before each, and the newest
  sample (on load, at the evaluation before now). Only an onset pair's first sample reads
  "below the ratio", so no other pair reads as an onset.
* **A young service** (bursts.young_need): its first traffic (to 0.1 s) and the sum and count
  of its needs since then, exactly (its margin reads their mean), while it is young: during its
  first burst window the state changes with each evaluation, and is written with each.
* **The correction**: the value and time of its last rise (growth, or held at its cap),
  exactly; `load` decays it from there to the evaluation before now, as each evaluation in
  between would have, so it decays without a write.
* **Bursts remembered.** The last two (the next scheduled one is expected from them).
* The first traffic is `status.autoscaling.trafficSince` (loop.py), not here.

Times are wall-clock seconds (the processes' monotonic clocks differ), from a fixed offset
per process, to 0.1 s; needs to 0.001 replica. The dict changes only
when what the decisions read changes: a service at rest is not written again. `VERSION` marks
the layout; `load` ignores any other (an older or newer operator starts afresh instead).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagoda.operator.autoscaling.bursts import MIN_ONSETS, Bursts, Sample
from pagoda.operator.autoscaling.demand import CORRECTION_DECAY, CORRECTION_PERIOD_S

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
    # (value, time) of the correction's last rise: it has decayed from there since (`raised`)
    raised: tuple[float, float] | None = None


def last_rise(
    before: tuple[float, float] | None, old: float, new: float, now: float
) -> tuple[float, float] | None:
    """The correction's last rise after an evaluation took it from `old` to `new` at `now` (held
    at its cap counts as a rise: it did not decay)."""
    if new <= 1.0:
        return None
    return (new, now) if new >= old or before is None else before


def decayed(value: float, elapsed_s: float) -> float:
    """A correction `value` after `elapsed_s` without overload (demand.learn_correction's
    decay, uncapped: the evaluations in between each decayed it by their own interval)."""
    periods = max(elapsed_s, 0.0) / CORRECTION_PERIOD_S
    return max(1.0, value * (1.0 - CORRECTION_DECAY) ** periods)


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
    if memory.raised is not None:  # exact, from its last rise: it decays without a write
        out["correction"] = [memory.raised[0], _t(memory.raised[1], offset)]
    elif round(memory.correction, 2) != 1.0:
        out["correction"] = round(memory.correction, 2)
    samples, newest = _samples(memory.bursts.samples)
    if samples:
        out["samples"] = [[_t(t, offset), need, above] for t, need, above in samples]
    if newest is not None:
        out["newest"] = newest
    if memory.bursts.young is not None and memory.bursts.since is not None:
        total, count = memory.bursts.young  # exact: the mean moves with every evaluation
        out["young"] = [_t(memory.bursts.since, offset), total, count]
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
    interval_s: float = 0.0,
) -> Memory | None:
    """The memory `dump` saved, on this process's clock (`offset`: its wall minus monotonic
    seconds); None when absent, of another version, or unreadable. `current`: the replicas
    running now; `since`: the first traffic (trafficSince) on this clock; `interval_s`: the
    evaluation interval (the saved evaluation is taken to be the one before `now`)."""
    if not isinstance(raw, Mapping) or raw.get("version") != VERSION:
        return None
    try:
        return _load(raw, now, offset, current, policy, since, interval_s)
    except (TypeError, ValueError, KeyError, IndexError):
        return None


def _load(
    raw: Mapping[str, Any],
    now: float,
    offset: float,
    current: int,
    policy: Policy,
    since: float | None,
    interval_s: float,
) -> Memory:
    def mono(t: Any) -> float:
        return min(now, float(t) - offset)  # a clock ahead of ours: no later than now

    history = [(mono(t), int(r)) for t, r in raw.get("recommendations") or ()]
    samples = [(mono(t), float(n), bool(a)) for t, n, a in raw.get("samples") or ()]
    # the last saved evaluation: one interval before this one, never before what it saved
    last_t = max([now - max(interval_s, 0.0)] + [t for t, _ in history] + [t for t, *_ in samples])
    if raw.get("recommending") is not None:
        last, *rest = raw["recommending"]
        start = rest[0] if rest else None
        if start is not None:  # outranked by the next: changes no window, keeps the run's start
            history.append((mono(start), int(last)))
            last_t = max(last_t, history[-1][0])
        history.append((last_t, int(last)))
        stale = start is None or now - mono(start) > policy.down_window_s + MAX_GAP_S
        if int(last) < current and stale:
            history.append((now, current))
    else:
        history.append((now, current))
    if raw.get("newest") is not None:
        need, above = raw["newest"]
        samples.append((last_t, float(need), bool(above)))
    onsets = tuple((mono(t), float(n)) for t, n in raw.get("bursts") or ())
    young: tuple[float, int] | None = None
    if raw.get("young") is not None:  # the first traffic to 0.1 s, and the needs since then
        first, total, count = raw["young"]
        since, young = mono(first), (float(total), int(count))
    elif since is not None:  # saved without it: the kept samples since then stand for all
        needs = [n for t, n, _ in samples if t >= since]
        young = (sum(needs), len(needs)) if needs else None
    up = raw.get("lastScaleUp")
    rise = None
    saved = raw.get("correction", 1.0)
    if isinstance(saved, list):  # its last rise: decayed since then until the last evaluation
        value, at = float(saved[0]), mono(saved[1])
        if not 0 < value < float("inf"):
            raise ValueError(f"correction {value}")
        rise, correction = (value, at), decayed(value, last_t - at)
    else:
        correction = float(saved)
    if not 0 < correction < float("inf"):
        raise ValueError(f"correction {correction}")
    return Memory(
        history=tuple(history),
        correction=correction,
        bursts=Bursts(tuple(samples), onsets, since, young),
        last_scale_up=None if up is None else mono(up),
        raised=rise,
    )
