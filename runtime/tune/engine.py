"""Engine profile: time real engine steps on this node (any device, any attention backend).

What is measured, with the real ``EngineCore`` (scheduler, model, sampler, token readback):

* prefill: one step that prefills ``C`` prompt tokens (split over several prompts when ``C`` is
  longer than a prompt may be) → step seconds and ``V_P = C / step`` tokens/s;
* decode: the median step of ``b`` sequences decoding at context ``L``. The ``b`` prompts share
  their first ``L - 1`` tokens (prefix caching), so a point costs one ``L``-token prefill instead
  of ``b``; each sequence still attends over its full ``L`` tokens;
* the KV cache: blocks, tokens, bytes per token.

Prompts are random token ids (fresh per measurement, so the prefix cache never serves a prefill).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.sampling.params import SamplingParams

DECODE_SLACK = 16  # extra tokens a decode request may generate before the timed steps


@dataclass(frozen=True)
class EnginePlan:
    """Which points to measure. Sizes are token counts; batches are sequences."""

    chunk_sizes: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int = 5
    prefill_repeats: int = 2

    def __post_init__(self) -> None:
        for name in ("chunk_sizes", "decode_batches", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"{name} must be non-empty positive integers, got {values!r}")
        if self.decode_steps < 1 or self.prefill_repeats < 1:
            raise ValueError("decode_steps and prefill_repeats must be >= 1")

    @property
    def num_points(self) -> int:
        return len(self.chunk_sizes) + len(self.decode_batches) * len(self.decode_contexts)


def make_plan(*, max_model_len: int, cuda: bool, quick: bool) -> EnginePlan:
    """Default points: wide on a GPU, small on a CPU, tiny with ``quick`` (tests, smoke runs)."""
    if quick:
        chunks, batches, contexts, steps, reps = (16, 64), (1, 4), (32, 96), 3, 1
    elif cuda:
        chunks = (256, 512, 1024, 2048, 4096, 8192)
        batches, contexts, steps, reps = (1, 8, 32, 128, 256), (512, 2048, 8192), 8, 3
    else:
        chunks, batches, contexts, steps, reps = (
            (32, 64, 128, 256, 512),
            (1, 4, 16),
            (128, 512),
            5,
            2,
        )
    limit = max(max_model_len - DECODE_SLACK - steps - 1, 2)
    contexts = tuple(sorted({min(c, limit) for c in contexts}))
    return EnginePlan(chunks, batches, contexts, steps, reps)


class EngineProfiler:
    """Measures one point at a time on a live engine (built with room for the largest point)."""

    def __init__(self, core: EngineCore, seed: int = 0) -> None:
        if core.async_scheduling:
            raise ValueError("the engine profile times synchronous steps (async_scheduling=False)")
        core.overlap_outputs = False  # a step's outputs come back from that step, not the next
        self.core = core
        self.rng = np.random.default_rng(seed)
        self._ids = itertools.count()
        self.vocab = core.model_config.vocab_size

    def _tokens(self, n: int) -> list[int]:
        return self.rng.integers(low=min(1000, self.vocab // 2), high=self.vocab, size=n).tolist()

    def _add(self, ids: list[int], max_tokens: int) -> str:
        rid = f"__tune-{next(self._ids)}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.core.add_request(rid, ids, params)
        return rid

    def _drain(self) -> None:
        while self.core.has_unfinished_requests():
            self.core.step()

    def warm_up(self) -> None:
        """One short request: the first step pays for lazy initialisation, never measured."""
        self._add(self._tokens(8), 2)
        self._drain()

    def prefill_point(self, chunk: int, repeats: int) -> dict:
        """Median seconds of a step that prefills exactly ``chunk`` new tokens."""
        per_prompt = self.core.max_model_len - 1
        sizes = [per_prompt] * (chunk // per_prompt) + (
            [chunk % per_prompt] if chunk % per_prompt else []
        )
        times = []
        for _ in range(repeats):
            rids = {self._add(self._tokens(n), 1) for n in sizes}
            start = time.perf_counter()
            outs = self.core.step()
            times.append(time.perf_counter() - start)
            if {o.request_id for o in outs} != rids:
                self._drain()
                raise RuntimeError(
                    f"a {chunk}-token prefill did not fit in one step (max_num_batched_tokens "
                    f"{self.core.scheduler.config.max_num_batched_tokens})"
                )
            self._drain()
        step = statistics.median(times)
        return {
            "chunk_tokens": chunk,
            "step_s": round(step, 6),
            "tokens_per_s": round(chunk / step, 1),
        }

    def decode_fits(self, batch: int, context: int, steps: int) -> bool:
        bs = self.core.kv.block_size
        per_seq = -(-(steps + DECODE_SLACK + bs) // bs) + 1
        needed = -(-context // bs) + batch * per_seq
        fits_len = context + steps + DECODE_SLACK < self.core.max_model_len
        limits = self.core.scheduler.config
        return needed <= self.core.kv.num_blocks and fits_len and batch <= limits.max_num_seqs

    def decode_point(self, batch: int, context: int, steps: int) -> dict:
        """Median seconds of a step in which ``batch`` sequences each decode at ``context``."""
        if not self.decode_fits(batch, context, steps):
            raise ValueError(f"decode point {batch}x{context} does not fit this engine")
        prefix = self._tokens(context - 1)
        budget = steps + DECODE_SLACK
        first = self._add([*prefix, *self._tokens(1)], budget)
        seen: dict[str, int] = {}
        while first not in seen:  # the shared prefix is computed (and cached) once
            seen.update((o.request_id, o.num_output_tokens) for o in self.core.step())
        rids = [first, *(self._add([*prefix, *self._tokens(1)], budget) for _ in range(batch - 1))]
        while len(seen) < batch:
            seen.update((o.request_id, o.num_output_tokens) for o in self.core.step())
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            outs = self.core.step()
            times.append(time.perf_counter() - start)
            if len(outs) != batch:
                raise RuntimeError(f"decode step ran {len(outs)} of {batch} sequences")
        for rid in rids:
            self.core.abort_request(rid)
        step = statistics.median(times)
        return {
            "batch": batch,
            "context": context,
            "step_s": round(step, 6),
            "tokens_per_s": round(batch / step, 1),
        }

    def kv_cache(self) -> dict:
        runner, bs = self.core.runner, self.core.kv.block_size
        blocks = self.core.kv.num_blocks
        return {
            "num_blocks": blocks,
            "block_size": bs,
            "capacity_tokens": blocks * bs,
            "bytes_per_token": runner.bytes_per_block // bs,
        }


def measure_engine(
    make_profiler: Callable[[], EngineProfiler],
    plan: EnginePlan,
    previous: dict | None,
    *,
    deadline: float,
    progress: Callable[[str], None] = lambda _: None,
    checkpoint: Callable[[dict], None] = lambda _: None,
) -> dict:
    """The ``engine`` section: previous points are kept, missing ones measured until ``deadline``.

    Returns ``{"prefill": [...], "decode": [...], "kv_cache": {...}, "complete": bool}``;
    incomplete sections resume on the next run. ``checkpoint`` gets the section after each point.
    The profiler (an engine: weights, KV cache) is only built when a point is left to measure.
    """
    previous = previous or {}
    prefill = {p["chunk_tokens"]: p for p in previous.get("prefill", [])}
    decode = {(p["batch"], p["context"]): p for p in previous.get("decode", [])}
    skipped: list[str] = []
    complete = True
    profiler: EngineProfiler | None = None
    kv_cache = previous.get("kv_cache")
    todo: list[tuple[str, tuple[int, ...]]] = [("prefill", (c,)) for c in plan.chunk_sizes]
    todo += [("decode", (b, L)) for L in plan.decode_contexts for b in plan.decode_batches]
    for kind, key in todo:
        done = key[0] in prefill if kind == "prefill" else key in decode
        label = f"{kind} {'x'.join(map(str, key))}"
        if done:
            progress(f"{label} (kept)")
            continue
        if time.monotonic() > deadline:
            complete = False
            progress(f"{label} (out of time)")
            continue
        if profiler is None:
            profiler = make_profiler()
            profiler.warm_up()
            kv_cache = profiler.kv_cache()
        if kind == "prefill":
            prefill[key[0]] = profiler.prefill_point(key[0], plan.prefill_repeats)
        elif profiler.decode_fits(*key, plan.decode_steps):
            decode[key] = profiler.decode_point(*key, plan.decode_steps)
        else:
            skipped.append(label)
        checkpoint(_section(kv_cache, prefill, decode, skipped, complete=False))
        progress(label)
    return _section(kv_cache, prefill, decode, skipped, complete=complete)


def _section(
    kv_cache: dict | None, prefill: dict, decode: dict, skipped: list[str], *, complete: bool
) -> dict:
    return {
        "prefill": [prefill[k] for k in sorted(prefill)],
        "decode": [decode[k] for k in sorted(decode, key=lambda k: (k[1], k[0]))],
        "kv_cache": kv_cache or {},
        "skipped": list(skipped),
        "complete": complete,
    }
