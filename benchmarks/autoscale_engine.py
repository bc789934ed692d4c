"""The queueing model of autoscale_sim.py: a fleet of `pagoda serve` replicas, token by token.

One replica is what `autoscale_measure.py` measured (`Capacity`): at most `slots` requests in its
batch and `kv_tokens` of KV cache; each engine step decodes one token for every running request
and prefills up to `chunk_tokens − b` prompt tokens (chunked prefill, the oldest prompt first),
and takes `decode_step_s(b) + prefill tokens / prefill_tokens_per_s` seconds (b = requests
decoding). A request's first token comes when its prompt is prefilled, plus the measured fixed
overhead (HTTP, tokenization) and one step. A new replica serves `startup_s` after it is created.

The Service is an inference-aware gateway: one FIFO over the fleet, each request going to the
ready replica with the fewest running requests that has a slot and KV room for its prompt and
output (no preemption). A replica scaled down stops taking requests and leaves when its last
finishes. Time advances in ticks of `DT`; inside a tick the prefills complete at their exact
fluid times. Numba compiles the tick loop when it is installed (`pip install numba`: a full
benchmark run needs it); without it the same code runs as plain Python, fine for a few minutes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


def njit(**options):
    """Numba's `njit(**options)`, imported and compiled on the first call: importing numba takes
    ~4 s of CPU, which every process that imports this module (each pytest worker collecting the
    benchmark tests) would otherwise pay. Without numba the plain function runs (correct, about
    100x slower)."""

    def wrap(fn):
        compiled = None

        @functools.wraps(fn)
        def call(*args):
            nonlocal compiled
            if compiled is None:
                try:
                    from numba import njit as numba_njit
                except ImportError:
                    compiled = fn
                else:
                    compiled = numba_njit(**options)(fn)
            return compiled(*args)

        return call

    return wrap


DT = 0.1  # seconds per tick
R_MAX = 160  # replica records (live + draining) the arrays hold


@dataclass(frozen=True)
class Capacity:
    """One replica, measured with `autoscale_sim.py --measure` (autoscale_measure.py)."""

    slots: int  # --max-num-seqs
    startup_s: float  # process start -> /ready
    overhead_s: float  # fixed part of an idle replica's time to first token
    prefill_tokens_per_s: float  # V_P: prompt tokens per second of prefill
    decode_step_s: tuple[tuple[int, float], ...]  # (batch, seconds per decode step)
    kv_tokens: int  # KV-cache capacity in tokens
    chunk_tokens: int = 2048  # --max-num-batched-tokens (the server's default)

    def step_table(self) -> np.ndarray:
        """Seconds of a decode step for 0..slots decoding requests (linear between points)."""
        b, s = zip(*sorted(self.decode_step_s))
        return np.interp(np.arange(self.slots + 1), (0, *b), (0.0, *s))

    def work_s(self, prompt: float, output: float) -> float:
        """Replica-seconds one request costs at a full batch (its prefill + its decode share)."""
        step = float(self.step_table()[self.slots])
        return prompt / self.prefill_tokens_per_s + output * step / self.slots

    def decode_tokens_per_s(self) -> float:
        """V_D at a full batch, as `pagoda tune` records it (max_num_seqs / decode step)."""
        return self.slots / float(self.step_table()[self.slots])

    def idle_ttft_s(self, prompt: float) -> float:
        return self.overhead_s + prompt / self.prefill_tokens_per_s + float(self.step_table()[1])


@njit(cache=True)
def _advance(
    t, t_end, dt, slots, chunk, vp, overhead, kv_cap, steps,
    arr, prompt, output, ttft, first_at, done_at, ptr,
    alive, ready_at, draining, n_run, kv_res,
    s_req, s_phase, s_pref, s_dec, s_seq,
    ev_t, ev_v, ev_p, counters,
):  # fmt: skip
    """Run the fleet from t to t_end; returns the new t. ptr = [next arrival, queue head,
    admission counter, events]; counters = [replica-seconds, completions, their prompt and output tokens]."""
    n = arr.shape[0]
    r_max = alive.shape[0]
    while t < t_end - 1e-9:
        t1 = t + dt
        # arrivals up to t1 join the FIFO; admit from its head while a replica can take it
        while ptr[0] < n and arr[ptr[0]] < t1:
            ptr[0] += 1
        while ptr[1] < ptr[0]:
            i = ptr[1]
            need = prompt[i] + output[i]
            best = -1
            for r in range(r_max):
                takes = alive[r] and not draining[r] and ready_at[r] < t1 and n_run[r] < slots
                if takes and kv_res[r] + need <= kv_cap and (best < 0 or n_run[r] < n_run[best]):
                    best = r
            if best < 0:
                break
            for k in range(slots):
                if s_req[best, k] < 0:
                    s_req[best, k] = i
                    s_phase[best, k] = 1
                    s_pref[best, k] = prompt[i]
                    s_dec[best, k] = output[i] - 1
                    s_seq[best, k] = ptr[2]
                    break
            ptr[2] += 1
            n_run[best] += 1
            kv_res[best] += need
            ptr[1] += 1
        live = 0
        for r in range(r_max):
            if not alive[r]:
                continue
            live += 1
            if ready_at[r] >= t1 or n_run[r] == 0:
                continue
            left = dt if ready_at[r] <= t else t1 - ready_at[r]
            b = 0
            for k in range(slots):
                if s_req[r, k] >= 0 and s_phase[r, k] == 2:
                    b += 1
            while left > 1e-12:
                h = -1
                for k in range(slots):
                    prefilling = s_req[r, k] >= 0 and s_phase[r, k] == 1
                    if prefilling and (h < 0 or s_seq[r, k] < s_seq[r, h]):
                        h = k
                if h < 0:  # decode only
                    if b > 0:
                        adv = left / steps[b]
                        for k in range(slots):
                            if s_req[r, k] >= 0 and s_phase[r, k] == 2:
                                s_dec[r, k] -= adv
                    left = 0.0
                    break
                c = max(1, chunk - b)
                tau = steps[b] + c / vp
                rate = c / tau
                need_t = s_pref[r, h] / rate
                used = min(need_t, left)
                if b > 0:
                    adv = used / tau
                    for k in range(slots):
                        if s_req[r, k] >= 0 and s_phase[r, k] == 2:
                            s_dec[r, k] -= adv
                if need_t <= left:
                    i = s_req[r, h]
                    now = t1 - left + need_t
                    start = max(arr[i], ready_at[r])
                    ft = max(now, start + prompt[i] / vp) + overhead + steps[b + 1]
                    ttft[i] = ft - arr[i]
                    first_at[i] = ft
                    e = ptr[3]
                    ev_t[e] = ft
                    ev_v[e] = ttft[i]
                    ev_p[e] = prompt[i]
                    ptr[3] += 1
                    s_pref[r, h] = 0.0
                    s_phase[r, h] = 2
                    b += 1
                else:
                    s_pref[r, h] -= rate * left
                left -= used
            # finished requests leave
            for k in range(slots):
                i = s_req[r, k]
                if i >= 0 and s_phase[r, k] == 2 and s_dec[r, k] <= 0.0:
                    done_at[i] = t1
                    s_req[r, k] = -1
                    s_phase[r, k] = 0
                    n_run[r] -= 1
                    kv_res[r] -= prompt[i] + output[i]
                    counters[1] += 1.0
                    counters[2] += prompt[i]
                    counters[3] += output[i]
            if draining[r] and n_run[r] == 0:
                alive[r] = False
        counters[0] += live * dt
        t = t1
    return t


@dataclass
class Observation:
    """What one scrape shows (all replicas together) plus the Deployment's counts."""

    t: float
    current: int  # spec.replicas
    ready: int  # status.readyReplicas
    waiting: int  # requests not yet running
    running: int  # requests in the batches
    kv_mean: float | None  # KV-cache usage, mean over ready replicas
    kv_max: float | None  # the fullest ready replica
    ttft_p95_s: float | None  # histogram_quantile(0.95, ...[1m]); None: no first token
    ttft_count: int  # first tokens in the window
    mean_prompt: float | None  # prompt tokens per first token, last minute (counters, 1m)
    mean_output: float | None  # output tokens per finished request, last minute (counters, 1m)
    arrival_rate: float  # requests/s arriving, last 30 s (completions + change in flight)
    arrival_rate_slow: float  # the same over the last 2 minutes
    queued_prompt_tokens: float  # exact prompt tokens waiting
    arrival_rate_fast: float = 0.0  # the same over the last 15 s


# The runtime's TTFT histogram buckets (runtime/server/metrics.py LATENCY_BUCKETS).
BUCKETS = np.array(
    (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
     1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
)  # fmt: skip


def histogram_quantile(q: float, values: np.ndarray) -> float | None:
    """Prometheus' histogram_quantile over `values` bucketed like the runtime's histogram."""
    if len(values) == 0:
        return None
    counts = np.bincount(np.searchsorted(BUCKETS, values, side="left"), minlength=len(BUCKETS) + 1)
    cum = np.cumsum(counts)
    rank = q * cum[-1]
    b = int(np.searchsorted(cum, rank, side="left"))
    if b >= len(BUCKETS):
        return float(BUCKETS[-1])
    lo = 0.0 if b == 0 else float(BUCKETS[b - 1])
    below = 0 if b == 0 else cum[b - 1]
    inside = counts[b]
    return lo + (float(BUCKETS[b]) - lo) * ((rank - below) / inside if inside else 1.0)


class Fleet:
    """The replicas and the requests; `advance`, `observe` and `resize` drive it."""

    def __init__(self, cap: Capacity, arrival, prompt, output, start: int) -> None:
        self.cap = cap
        self.steps = cap.step_table()
        n, s = len(arrival), cap.slots
        self.arr = np.ascontiguousarray(arrival, dtype=np.float64)
        self.prompt = np.ascontiguousarray(prompt, dtype=np.int64)
        self.output = np.ascontiguousarray(output, dtype=np.int64)
        self.ttft = np.full(n, np.nan)
        self.first_at = np.full(n, np.nan)
        self.done_at = np.full(n, np.nan)
        self.ptr = np.zeros(4, dtype=np.int64)
        self.alive = np.zeros(R_MAX, dtype=np.bool_)
        self.ready_at = np.zeros(R_MAX)
        self.draining = np.zeros(R_MAX, dtype=np.bool_)
        self.n_run = np.zeros(R_MAX, dtype=np.int64)
        self.kv_res = np.zeros(R_MAX, dtype=np.int64)
        self.s_req = np.full((R_MAX, s), -1, dtype=np.int64)
        self.s_phase = np.zeros((R_MAX, s), dtype=np.int64)
        self.s_pref = np.zeros((R_MAX, s))
        self.s_dec = np.zeros((R_MAX, s))
        self.s_seq = np.zeros((R_MAX, s), dtype=np.int64)
        self.ev_t = np.zeros(n)
        self.ev_v = np.zeros(n)
        self.ev_p = np.zeros(n)
        self.counters = np.zeros(4)
        self.t = 0.0
        self.alive[:start] = True  # warm at the start
        self._marks: list[tuple[float, int, int, float, float]] = []  # (t, events, arrivals, ...)

    # --- time -------------------------------------------------------------------------------

    def advance(self, until: float) -> None:
        c = self.cap
        self.t = _advance(
            self.t, until, DT, c.slots, c.chunk_tokens, c.prefill_tokens_per_s, c.overhead_s,
            c.kv_tokens, self.steps,
            self.arr, self.prompt, self.output, self.ttft, self.first_at, self.done_at, self.ptr,
            self.alive, self.ready_at, self.draining, self.n_run, self.kv_res,
            self.s_req, self.s_phase, self.s_pref, self.s_dec, self.s_seq,
            self.ev_t, self.ev_v, self.ev_p, self.counters,
        )  # fmt: skip

    @property
    def replica_seconds(self) -> float:
        return float(self.counters[0])

    # --- what Prometheus and the Deployment show --------------------------------------------

    def _live(self) -> np.ndarray:
        return self.alive & ~self.draining

    def counts(self) -> tuple[int, int]:
        live = self._live()
        return int(live.sum()), int((live & (self.ready_at <= self.t)).sum())

    def observe(self, window_s: float = 60.0) -> Observation:
        t = self.t
        events, arrivals = int(self.ptr[3]), int(self.ptr[0])
        self._marks.append((t, events, arrivals, *self.counters[1:]))
        while self._marks[0][0] < t - 150.0:
            self._marks.pop(0)

        def back(s: float) -> tuple:
            return next(m for m in self._marks if m[0] >= t - s - 1e-9)

        def rate(s: float, col: int) -> float:
            m = back(s)
            return (self._marks[-1][col] - m[col]) / (t - m[0]) if t > m[0] else 0.0

        old = back(window_s)
        sl = slice(old[1], events)
        recent = self.ev_t[sl] > t - window_s
        window, prompts = self.ev_v[sl][recent], self.ev_p[sl][recent]
        current, ready = self.counts()
        rdy = self._live() & (self.ready_at <= t)
        kv = self._kv_usage()[rdy] if ready else None
        done = self.counters[1] - old[3]
        head = int(self.ptr[1])
        arrived = int(np.searchsorted(self.arr, t, side="right"))
        return Observation(
            t=t, current=current, ready=ready,
            waiting=max(0, arrived - head), running=int(self.n_run[self.alive].sum()),
            kv_mean=None if kv is None else float(kv.mean()),
            kv_max=None if kv is None else float(kv.max()),
            ttft_p95_s=histogram_quantile(0.95, window), ttft_count=len(window),
            mean_prompt=float(prompts.mean()) if len(prompts) else None,
            mean_output=(self.counters[3] - old[5]) / done if done > 0 else None,
            arrival_rate=rate(30.0, 2),
            arrival_rate_slow=rate(120.0, 2), arrival_rate_fast=rate(15.0, 2),
            queued_prompt_tokens=float(self.prompt[head:arrived].sum()),
        )  # fmt: skip

    def _kv_usage(self) -> np.ndarray:
        """Tokens in each replica's KV cache (prompt prefilled so far + generated) / capacity."""
        req = self.s_req
        used = req >= 0
        safe = np.where(used, req, 0)
        prefilled = self.prompt[safe] - self.s_pref
        generated = np.where(self.s_phase == 2, self.output[safe] - np.maximum(self.s_dec, 0), 0)
        tokens = np.where(used, prefilled + generated, 0.0).sum(axis=1)
        return tokens / self.cap.kv_tokens

    # --- the Deployment's replicas ----------------------------------------------------------

    def resize(self, want: int) -> None:
        live = np.flatnonzero(self._live())
        if want > len(live):
            free = np.flatnonzero(~self.alive)[: want - len(live)]
            if len(free) < want - len(live):
                raise RuntimeError("R_MAX too small for the replicas asked for")
            self.alive[free] = True
            self.draining[free] = False
            self.ready_at[free] = self.t + self.cap.startup_s
        elif want < len(live):
            # like the ReplicaSet controller: not-ready pods first, then the least busy
            key = sorted(live, key=lambda r: (self.ready_at[r] <= self.t, self.n_run[r]))
            for r in key[: len(live) - want]:
                self.draining[r] = True
                if self.n_run[r] == 0:
                    self.alive[r] = False
