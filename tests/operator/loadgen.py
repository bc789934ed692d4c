"""Closed-loop load generator for the autoscaling end-to-end test.

    python loadgen.py --concurrency 24 URL [URL ...]

Each worker sends completions (round robin over the servers) back to back until SIGTERM/SIGINT,
then prints one JSON line: requests, errors, and the client-side p50/p95 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import time

import aiohttp

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip.",
    "Tell me a story about a cat and a dog in a park.",
]


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("urls", nargs="+")
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    targets = itertools.cycle(args.urls)
    latencies: list[float] = []
    errors = 0

    async def worker(i: int, session: aiohttp.ClientSession) -> None:
        nonlocal errors
        for n in itertools.count():
            if stop.is_set():
                return
            body = {
                "model": args.model,
                "prompt": PROMPTS[(i + n) % len(PROMPTS)],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            t0 = time.monotonic()
            try:
                async with session.post(f"{next(targets)}/v1/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        await asyncio.sleep(0.1)
                        continue
            except aiohttp.ClientError:
                errors += 1
                await asyncio.sleep(0.1)
                continue
            latencies.append(time.monotonic() - t0)

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [asyncio.create_task(worker(i, session)) for i in range(args.concurrency)]
        await stop.wait()
        await asyncio.wait(tasks, timeout=10)
        for t in tasks:
            t.cancel()
    latencies.sort()
    q = (lambda f: round(latencies[int(f * (len(latencies) - 1))], 3)) if latencies else None
    print(
        json.dumps(
            {
                "requests": len(latencies),
                "errors": errors,
                "p50_s": q(0.5) if q else None,
                "p95_s": q(0.95) if q else None,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main())
