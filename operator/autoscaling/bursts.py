"""The burst floor: the fleet a service's recent bursts needed, held while the bursts recur. Pure.

The demand floor (demand.py) sizes the fleet for the arrival rate of the last 30 s. A service
whose requests come in bursts (tens of seconds of many long prompts, then quiet minutes) needs
its bursts' capacity *standing* when the next one lands: a replica asked for when a burst is seen
serves a start-up later, after the burst's first requests have queued past any TTFT target. So
every evaluation records the **fast need**: the arrival rate of the last 15 s times what a
request costs a replica (replicas busy). A sample whose fast need exceeds `ONSET_RATIO` × the
slow need (the 2-minute rate's) while the sample before did not is a burst **onset**.

While at least `MIN_ONSETS` onsets fall within the window, the floor holds the largest fast need
of the window: the bursts recur, so the next one is planned for. A level shift (one step up) or
an isolated burst (one per window) holds nothing: the demand floor follows them down after the
scale-down window, as before. The samples are kept by the caller, like the history.
"""

from __future__ import annotations

import itertools

ONSET_RATIO = 2.0  # a fast need this many times the slow one is a burst
MIN_ONSETS = 2  # bursts within the window before the floor holds their need
IDLE_BUSY = 0.5  # slow needs below this count as this: from idle, any real arrival is an onset

Sample = tuple[float, float, bool]  # (time, fast need in busy replicas, above the onset ratio)
Samples = tuple[Sample, ...]


def record(samples: Samples, now: float, fast: float, slow: float, window_s: float) -> Samples:
    """Append this evaluation's fast need (`slow`: the same from the 2-minute rate) and drop the
    samples older than the window."""
    kept = tuple(s for s in samples if now - s[0] <= window_s)
    return (*kept, (now, fast, fast > ONSET_RATIO * max(slow, IDLE_BUSY)))


def onsets(samples: Samples) -> int:
    """Rises above the onset ratio within the samples (the first sample cannot be one)."""
    return sum(1 for a, b in itertools.pairwise(samples) if b[2] and not a[2])


def burst_need(samples: Samples) -> float | None:
    """Busy replicas the recent bursts needed, if they recur (None: no floor)."""
    if onsets(samples) < MIN_ONSETS:
        return None
    return max(s[1] for s in samples)
