"""Measures one `pagoda serve` replica for autoscale_sim.py (`--measure`): the token-level
capacity model the simulator replays.

* start-up: process start → `/ready`;
* prefill: idle time to first token of prompts of 32, 512 and 2048 tokens (token ids, one output
  token), fitted as `overhead + prompt tokens / V_P` (least squares);
* decode step curve: `b` streaming requests at once (32-token prompts, 64 output tokens each),
  the mean gap between their tokens, for b = 1, 2, 4, 8, 16 (`--max-num-seqs`);
* KV-cache capacity in tokens: the `pagoda:kv_cache_usage_perc` gauge while a request of known
  length runs.
"""

from __future__ import annotations

import asyncio
import pathlib
import re
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
import numpy as np

SLOTS = 16
MAX_MODEL_LEN = 8192
KV_CACHE_MEMORY = "1GiB"
PREFILL_LENGTHS = (32, 512, 2048)
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_TOKENS = 64


def _prompt(n: int, salt: int) -> list[int]:
    """`n` token ids, different per `salt` (so the prefix cache never hits)."""
    rng = np.random.default_rng(salt)
    return [int(x) for x in rng.integers(100, 40000, n)]


def measure_replica(root: pathlib.Path) -> dict:
    """Start `pagoda serve` (embedded model) from `root` and measure it: the fields of
    autoscale_sim.Capacity."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", str(port),
        "--kv-cache-memory", KV_CACHE_MEMORY, "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(SLOTS), "--log-level", "warning",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, t0)
        startup = time.monotonic() - t0
        return {"slots": SLOTS, "startup_s": round(startup, 1), **asyncio.run(_measure(base))}
    finally:
        proc.terminate()
        proc.wait(30)


def _wait_ready(proc, base: str, t0: float) -> None:
    """Poll /ready until the server answers 200 (at most 300 s after t0, or until it exits)."""
    while True:
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            raise RuntimeError("pagoda serve did not become ready")
        time.sleep(0.1)


async def _stream(s, base: str, prompt: list[int], max_tokens: int) -> list[float]:
    """One streamed completion: the arrival time of each data line (time 0 = sent)."""
    body = {
        "model": "smollm2-135m", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
        "temperature": 0, "stream": True,
    }  # fmt: skip
    start = time.monotonic()
    times = []
    async with s.post(f"{base}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                times.append(time.monotonic() - start)
    return times


async def _kv_usage(s, base: str) -> float:
    async with s.get(f"{base}/metrics") as r:
        text = await r.text()
    m = re.search(r"^pagoda:kv_cache_usage_perc\{[^}]*\} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _measure(base: str) -> dict:
    salt = iter(range(1, 10_000))
    async with aiohttp.ClientSession() as s:
        for _ in range(3):  # warm-up: first shapes
            await _stream(s, base, _prompt(512, next(salt)), 4)
        xs, ys = [], []
        for n in PREFILL_LENGTHS:
            for _ in range(3):
                t = await _stream(s, base, _prompt(n, next(salt)), 1)
                xs.append(n)
                ys.append(t[0])
        # least squares on each length's median (the machine is shared: single runs stray)
        med = [float(np.median([y for x, y in zip(xs, ys) if x == n])) for n in PREFILL_LENGTHS]
        slope, overhead = np.polyfit(PREFILL_LENGTHS, med, 1)
        steps = {}
        for b in DECODE_BATCHES:
            runs = await asyncio.gather(
                *(_stream(s, base, _prompt(32, next(salt)), DECODE_TOKENS) for _ in range(b))
            )
            # the gaps after every stream's first token (all prefills done): decode steps only
            settled = max(r[0] for r in runs)
            gaps = [np.diff([x for x in r if x > settled]) for r in runs]
            steps[b] = float(np.median(np.concatenate(gaps)))
        # KV capacity: one long request's tokens over the gauge while it decodes
        probe = asyncio.ensure_future(_stream(s, base, _prompt(2048, next(salt)), 512))
        await asyncio.sleep(2 * med[-1] + 1.0)  # past its prefill, well before its end
        usage = await _kv_usage(s, base)
        await probe
    return {
        "overhead_s": round(float(overhead), 4),
        "prefill_tokens_per_s": round(1.0 / float(slope), 0),
        "decode_step_s": {b: round(v, 5) for b, v in steps.items()},
        "kv_tokens": int(round(2048 / usage, -2)) if usage > 0 else 0,
        "prefill_samples": [[x, round(y, 4)] for x, y in zip(xs, ys)],
    }
