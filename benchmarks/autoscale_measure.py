"""Measures one `pagoda serve` replica for autoscale_sim.py (`--measure`): startup time, idle
and saturated time to first token, and saturated throughput with 16 streaming clients."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
import numpy as np

MEASURE_REQUEST = {
    "model": "smollm2-135m", "max_tokens": 32, "ignore_eos": True, "temperature": 0, "stream": True,
    "prompt": "Summarise in a few sentences why the sky looks blue during the day "
    "and red at sunset, for a curious ten year old reader.",
}  # fmt: skip


def measure_replica(root: pathlib.Path) -> dict[str, float]:
    """Start `pagoda serve` (embedded model, 16 slots) from `root` and time it idle and
    saturated: the fields of autoscale_sim.Capacity."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", str(port),
        "--kv-cache-memory", "128MiB", "--max-model-len", "512", "--max-num-seqs", "16",
        "--log-level", "warning",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, t0)
        startup = time.monotonic() - t0
        ttft0, busy, rps = asyncio.run(_load_test(base))
        return {
            "slots": 16, "service_s": round(16 / rps, 2), "ttft0_s": round(ttft0, 3),
            "ttft_busy_s": round(busy, 3), "startup_s": round(startup, 1),
        }  # fmt: skip
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


async def _timed_request(s, base: str) -> tuple[float, float]:
    """One streamed completion: (time to the first data line, total time)."""
    start = time.monotonic()
    first = None
    async with s.post(f"{base}/v1/completions", json=MEASURE_REQUEST) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if first is None and line.startswith(b"data:"):
                first = time.monotonic() - start
    return first or 0.0, time.monotonic() - start


async def _load_test(base: str) -> tuple[float, float, float]:
    """Idle TTFT (median of 8 sequential requests, the first 2 as warm-up), then 16 clients for
    45 s: (idle TTFT, busy TTFT, requests/s)."""
    async with aiohttp.ClientSession() as s:
        idle = [await _timed_request(s, base) for _ in range(8)]
        done: list[tuple[float, float]] = []
        end = time.monotonic() + 45

        async def worker() -> None:
            while time.monotonic() < end:
                done.append(await _timed_request(s, base))

        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(16)))
        elapsed = time.monotonic() - t
    ttft0 = float(np.median([a for a, _ in idle[2:]]))
    busy = float(np.median([a for a, _ in done]))
    return ttft0, busy, len(done) / elapsed
