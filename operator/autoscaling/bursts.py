"""The burst floor: the fleet a service's bursts need, standing before they land. Pure.

The demand floor (demand.py) sizes the fleet for the arrival rate of the last 30 s. A service
whose requests come in bursts (a minute or two of many requests, then quiet) needs its bursts'
capacity *standing* when the next one lands: a replica asked for when a burst is seen serves a
start-up later, after the burst's first requests have queued past any TTFT target. So every
evaluation records the **fast need**: the arrival rate of the last 15 s times what a request
costs a replica (replicas busy). A sample whose fast need exceeds `ONSET_RATIO` × the slow need
(the 2-minute rate's) while the sample before did not is a burst **onset**.

Two ways a burst is known to be coming:

* **recurring** (`burst_need`): while at least `MIN_ONSETS` onsets fall within the window
  (`burst_window_s`, 15 min), the floor holds the largest fast need of the window;
* **scheduled** (`scheduled_need`): bursts farther apart than the window, at a steady interval
  (a job every half hour or hour). Each burst is remembered for `burst_memory_s` (2 h) with the
  largest fast need of its first `PEAK_S`; from the last two, the next one is expected one
  interval after the last, and the floor holds their need from `lead_s` + `JITTER` × the
  interval (at least `MIN_AHEAD_S`) before it until as long after. The burst, when it lands,
  becomes the new last one. A burst that does not come costs that stretch at the burst's need.

A sample's need is the larger of its work and its **clump** (`clump_need`): long prompts that
come together need replicas for their *prefill latency*, not only for their work. The prompt
tokens of the last 15 s, had they all come within one scrape (`CLUMP_SPAN_S`), must be prefilled
within the TTFT budget (llm-d's `T − ISL/V_P`): a code assistant's 300,000 prompt tokens in 5 s
keep a replica busy for 2.6 minutes in all, but need 30 replicas at once to answer within 8 s.
Held like a burst's, the clumps of the window stand for the next one.

A level shift (one step up) or an isolated burst holds nothing: the demand floor follows them
down after the scale-down window, as before (but see a young service, below).

**A young service** (`young_need`) has no history to tell how large its bursts get: in the
first `burst_window_s` after it starts taking traffic, the next burst may be several times the
largest seen so far (a code assistant's first clump of 165,000 prompt tokens, then one of
830,000 two minutes later). While what it has shown is bursty (the largest need since its first
traffic more than `ONSET_RATIO` × the mean need since then, idle samples included: the test an
onset applies), the floor holds that largest need times the burstiness (peak over
`ONSET_RATIO` × mean, at most `margin`, the policy's `young_margin`), the margin fading linearly
to none over the window. Smooth traffic and ramps (peak ≤ twice the mean) hold nothing; a step
up from a trickle counts as bursty until the mean catches up. The caller keeps the state, like
the history; `since` survives an operator restart through `status.autoscaling.trafficSince`
(loop.py), so a restart does not make an old service young again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

ONSET_RATIO = 2.0  # a fast need this many times the slow one is a burst
MIN_ONSETS = 2  # bursts within the window before the floor holds their need
IDLE_BUSY = 0.5  # slow needs below this count as this: from idle, any real arrival is an onset
PEAK_S = 120.0  # a burst's need: the largest fast need this long from its onset
MERGE_S = 120.0  # an onset this soon after a remembered burst's is the same burst
FAST_WINDOW_S = 15.0  # the fast arrival rate's window (prometheus.py)
CLUMP_SPAN_S = 5.0  # a clump of prompts may come within one scrape interval
JITTER = 0.05  # a scheduled burst is held this share of its interval either side
MIN_AHEAD_S = 60.0  # ... and at least this long either side (plus the lead before)
YOUNG_MARGIN = 4.0  # a young bursty service's largest need is held at most this many times

Sample = tuple[float, float, bool]  # (time, fast need in busy replicas, above the onset ratio)
Samples = tuple[Sample, ...]
Onset = tuple[float, float]  # (time of a burst's onset, its need in busy replicas)


@dataclass(frozen=True)
class Bursts:
    """What the burst floor remembers between evaluations (keep it, pass it back)."""

    samples: Samples = ()  # every evaluation's fast need within the window
    onsets: tuple[Onset, ...] = ()  # distinct bursts within the memory, oldest first
    since: float | None = None  # the first evaluation with traffic (None: none yet)
    # while young (within the window since `since`): the sum and count of the needs since then
    # (young_need's mean; kept apart from `samples` so that memory.py can save it exactly)
    young: tuple[float, int] | None = None


def clump_need(
    arrival_rate_fast: float | None,
    prompt_tokens: float | None,
    prefill_tokens_per_s: float | None,
    ttft_target_s: float | None,
) -> float | None:
    """Replicas that prefill the prompt tokens of the last `FAST_WINDOW_S` within the TTFT budget
    had they come within `CLUMP_SPAN_S` (None: something unknown, or no budget)."""
    if not arrival_rate_fast or not prompt_tokens or not prefill_tokens_per_s or not ttft_target_s:
        return None
    budget = ttft_target_s - prompt_tokens / prefill_tokens_per_s
    if budget <= 0:
        return None  # a lone prompt misses the target: more replicas do not help
    tokens = arrival_rate_fast * FAST_WINDOW_S * prompt_tokens
    return tokens / (prefill_tokens_per_s * (CLUMP_SPAN_S + budget))


def record(
    state: Bursts,
    now: float,
    fast: float,
    slow: float,
    window_s: float,
    memory_s: float = 0.0,
    clump: float | None = None,
) -> Bursts:
    """Append this evaluation's fast need (`slow`: the same from the 2-minute rate), note a new
    burst or the current one's need, and forget what is older than the window (samples) and the
    memory (bursts). `clump` (`clump_need`): the sample's need when larger than `fast`; onsets
    are still `fast` against `slow`."""
    kept = tuple(s for s in state.samples if now - s[0] <= window_s)
    above = fast > ONSET_RATIO * max(slow, IDLE_BUSY)
    if clump is not None:
        fast = max(fast, clump)
    onset = above and bool(kept) and not kept[-1][2]
    onsets = tuple(o for o in state.onsets if now - o[0] <= memory_s)
    if onsets and now - onsets[-1][0] <= PEAK_S:
        onsets = (*onsets[:-1], (onsets[-1][0], max(onsets[-1][1], fast)))
    elif onset and memory_s > 0 and not (onsets and now - onsets[-1][0] <= MERGE_S):
        onsets = (*onsets, (now, fast))
    since = state.since if state.since is not None or fast <= 0 else now
    young = None
    if since is not None and now - since < window_s:
        total, count = state.young or (0.0, 0)
        young = (total + fast, count + 1)
    return Bursts((*kept, (now, fast, above)), onsets, since, young)


def onsets(samples: Samples) -> int:
    """Rises above the onset ratio within the samples (the first sample cannot be one)."""
    return sum(1 for a, b in itertools.pairwise(samples) if b[2] and not a[2])


def burst_need(state: Bursts) -> float | None:
    """Busy replicas the recent bursts needed, if they recur within the window (None: no floor)."""
    if onsets(state.samples) < MIN_ONSETS:
        return None
    return max(s[1] for s in state.samples)


def expected(state: Bursts, now: float, lead_s: float) -> tuple[float, float] | None:
    """(time, busy replicas) of the next scheduled burst when `now` is within its hold, else None.
    The last two bursts set the interval and the need."""
    if len(state.onsets) < 2:
        return None
    (t0, need0), (t1, need1) = state.onsets[-2:]
    interval = t1 - t0
    due = t1 + interval
    margin = max(MIN_AHEAD_S, JITTER * interval)
    if due - margin - lead_s <= now <= due + margin:
        return due, max(need0, need1)
    return None


def scheduled_need(state: Bursts, now: float, lead_s: float) -> float | None:
    """Busy replicas the next scheduled burst needs while it is due (None: none due)."""
    due = expected(state, now, lead_s)
    return None if due is None else due[1]


def young_need(state: Bursts, now: float, window_s: float, margin: float) -> float | None:
    """Busy replicas a young service holds (None: older than `window_s` since its first traffic,
    none yet, or not bursty): its largest need times its burstiness (peak over `ONSET_RATIO` ×
    mean since the first traffic, at most `margin`), the margin fading to none over the window."""
    if state.since is None or margin <= 1.0:
        return None
    age = now - state.since
    if age >= window_s or not state.young or not state.young[1]:
        return None
    peak = max(s[1] for s in state.samples if s[0] >= state.since)
    mean = state.young[0] / state.young[1]
    if mean <= 0:
        return None
    burstiness = min(margin, peak / (ONSET_RATIO * mean))
    if burstiness <= 1.0:
        return None  # smooth or a ramp: the demand floor's trend covers it
    return peak * (1.0 + (burstiness - 1.0) * (1.0 - age / window_s))
