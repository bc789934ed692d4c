"""Traffic for autoscale_sim.py: per-request arrival times and token counts.

Synthetic shapes are a load curve in *replicas' worth* (1.0 = what one replica serves at a full
batch), turned into a Poisson stream of short chat requests; the trace shapes replay the Azure
LLM inference trace 2023 (benchmarks/data/README.md: provenance and licence), its arrival times
and token counts, at a higher rate to stress the fleet.
"""

from __future__ import annotations

import csv
import datetime
import gzip
import math
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DATA = pathlib.Path(__file__).resolve().parent / "data"
MAX_MODEL_LEN = 8192  # the measured replica's context (autoscale_measure.MAX_MODEL_LEN)
SYNTH_PROMPT = (20, 40)  # prompt tokens, uniform: short chat turns
SYNTH_OUTPUT_MEAN = 32.0  # output tokens, gamma with shape 4 around this mean


@dataclass(frozen=True)
class Requests:
    arrival: np.ndarray  # seconds, sorted
    prompt: np.ndarray  # prompt tokens (int64)
    output: np.ndarray  # output tokens (int64, >= 1)
    clipped: int = 0  # prompts cut to fit the context

    def __len__(self) -> int:
        return len(self.arrival)


@dataclass(frozen=True)
class Shape:
    name: str
    duration_s: float
    target_ttft_s: float  # the SLO: p95 time to first token
    make: Callable[[Callable[[float, float], float], int], Requests]  # (work_s, seed)
    describe: str


# --- synthetic shapes: load in replicas' worth as a function of time ---------------------------


def steps(t: float) -> float:
    return [2, 8, 3, 12, 2][min(int(t // 3600), 4)]


def spikes(t: float) -> float:
    return 12.0 if (t - 900) % 1800 < 120 else 3.0  # 2-minute bursts every half hour, from 15 min


def diurnal(t: float) -> float:
    return 6.5 + 5.5 * math.sin(2 * math.pi * t / 21600 - math.pi / 2)  # a 6 h "day"


def synthetic(load: Callable[[float], float], duration_s: float):
    """A Poisson stream whose rate follows `load` (replicas' worth of the mean request)."""

    def make(work_s: Callable[[float, float], float], seed: int) -> Requests:
        rng = np.random.default_rng(seed)
        per_replica = 1.0 / work_s(np.mean(SYNTH_PROMPT), SYNTH_OUTPUT_MEAN)  # requests/s
        seconds = np.arange(int(duration_s))
        rate = np.array([load(float(t)) for t in seconds]) * per_replica
        counts = rng.poisson(rate)
        arrival = np.sort(np.repeat(seconds, counts) + rng.random(counts.sum()))
        n = len(arrival)
        prompt = rng.integers(SYNTH_PROMPT[0], SYNTH_PROMPT[1] + 1, n)
        output = np.maximum(1, np.rint(rng.gamma(4.0, SYNTH_OUTPUT_MEAN / 4.0, n))).astype(np.int64)
        return Requests(arrival, prompt.astype(np.int64), output)

    return make


# --- the Azure trace --------------------------------------------------------------------------


def read_trace(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds from the first request, prompt tokens, output tokens) of `conv` or `code`."""
    path = DATA / f"AzureLLMInferenceTrace_{kind}.csv.gz"
    with gzip.open(path, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = np.array(
        [datetime.datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]
    )
    prompt = np.array([int(r["ContextTokens"]) for r in rows], dtype=np.int64)
    output = np.array([int(r["GeneratedTokens"]) for r in rows], dtype=np.int64)
    return stamps - stamps[0], prompt, output


def trace(kind: str, scale: float):
    """The trace, each request replayed `scale` times on average (the whole part always, the
    fraction at random); copies land within a second after the original."""

    def make(work_s: Callable[[float, float], float], seed: int) -> Requests:
        rng = np.random.default_rng(seed)
        t, prompt, output = read_trace(kind)
        copies = int(scale) + (rng.random(len(t)) < scale - int(scale))
        idx = np.repeat(np.arange(len(t)), copies)
        first = np.r_[True, idx[1:] != idx[:-1]]
        arrival = t[idx] + np.where(first, 0.0, rng.random(len(idx)))
        order = np.argsort(arrival, kind="stable")
        out = np.maximum(1, np.minimum(output[idx], MAX_MODEL_LEN // 2))[order]
        p = prompt[idx][order]
        fit = np.minimum(p, MAX_MODEL_LEN - out)
        return Requests(arrival[order], np.maximum(1, fit), out, int((p > fit).sum()))

    return make


TRACE_SCALE = {"conv": 3.0, "code": 1.5}

SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("steps", 5 * 3600.0, 0.5, synthetic(steps, 5 * 3600.0),
              "2 → 8 → 3 → 12 → 2 replicas' worth, one hour each"),
        Shape("spikes", 4 * 3600.0, 0.5, synthetic(spikes, 4 * 3600.0),
              "3 replicas' worth, 2-minute bursts to 12 every half hour (from 15 min)"),
        Shape("diurnal", 6 * 3600.0, 0.5, synthetic(diurnal, 6 * 3600.0),
              "a sine between 1 and 12 replicas' worth over a 6-hour day"),
        Shape("trace-conv", 3600.0, 5.0, trace("conv", TRACE_SCALE["conv"]),
              f"Azure conversation trace 2023, 58 min, rate x{TRACE_SCALE['conv']:g}"),
        Shape("trace-code", 3600.0, 8.0, trace("code", TRACE_SCALE["code"]),
              f"Azure code trace 2023, 57 min, rate x{TRACE_SCALE['code']:g}"),
    )
}  # fmt: skip
