"""The HTTP load of gpu_serving.py: its two workloads and the closed-loop clients that send them.

Workloads: `nano`, nano-vllm's bench.py on `/v1/completions` (random prompt ids, input and output
lengths uniform in [lo, hi]), and `chat`, a chat-like mix on `/v1/chat/completions` (one shared
system prompt, user turns and replies log-uniform), both `ignore_eos`, encoded as JSON bodies
once, outside the timed part. Clients: aiohttp, each sending its next request when its previous
one has completed, spread over client processes (spawned: they import neither torch nor the
engine); each request's record has its start and end, TTFT, gaps between text events and
token count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time

SYSTEM_TOKENS = 64  # the chat mix's shared system prompt


# -- workloads -------------------------------------------------------------------------------
def nano_requests(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """nano-vllm's bench.py: (random prompt ids, output length), both lengths uniform in
    [lo, hi] (gpu_throughput.workload's draw, so the offline run gets the same requests)."""
    rng = random.Random(seed)
    return [
        ([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi))
        for _ in range(n)
    ]


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(max(lo, hi)))))


def chat_requests(n: int, max_len: int, words, seed: int) -> list[tuple[list[dict], int]]:
    """(messages, output length): a shared system prompt, user turns and replies log-uniform.
    `words(rng, k)` makes text of about k tokens for the served model's tokenizer."""
    rng = random.Random(seed + 1)
    sys_len, lo = min(SYSTEM_TOKENS, max_len // 4), min(16, max_len // 4)
    system = words(random.Random(seed), sys_len)
    # prompts stay within max_len with the template's tokens (~32), replies within max_len / 2
    user_hi, out_hi = max(lo, max_len - sys_len - 32), max(lo, max_len // 2)
    return [
        (
            [
                {"role": "system", "content": system},
                {"role": "user", "content": words(rng, log_uniform(rng, lo, user_hi))},
            ],
            log_uniform(rng, lo, out_hi),
        )
        for _ in range(n)
    ]


def word_text(vocab: int):
    """Text for the random models' word-level tokenizer: token `w<i>` is id i."""
    return lambda rng, k: " ".join(f"w{rng.randrange(3, vocab)}" for _ in range(k))


def corpus_text(tokenizer):
    """Text for a real tokenizer: slices of Python's `argparse` source (natural tokens)."""
    import inspect

    corpus = tokenizer.encode(inspect.getsource(argparse), add_special_tokens=False)

    def words(rng: random.Random, k: int) -> str:
        start = rng.randrange(0, len(corpus) - k)
        return tokenizer.decode(corpus[start : start + k])

    return words


def bodies(kind: str, reqs: list, stream: bool, model: str) -> list[bytes]:
    """The JSON request bodies of one run (encoded once, outside the timed part)."""
    out = []
    for prompt, out_len in reqs:
        body = {"model": model, "max_tokens": out_len, "temperature": 0.6, "ignore_eos": True,
                "stream": stream}  # fmt: skip
        if stream:
            body["stream_options"] = {"include_usage": True}
        body["prompt" if kind == "nano" else "messages"] = prompt
        out.append(json.dumps(body).encode())
    return out


# -- clients ---------------------------------------------------------------------------------
try:  # the clients share the machine with the server: parse their events cheaply
    from orjson import loads
except ImportError:  # the GPU node's venv may lack it
    from json import loads


def _has_text(choice: dict) -> bool:
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


async def one_request(session, url: str, body: bytes, stream: bool) -> dict:
    """One request; its start/end times, TTFT, gaps between text events and token count."""
    t0 = time.perf_counter()
    rec: dict = {"start": t0, "end": t0, "ttft": None, "gaps": [], "tokens": 0, "error": None}
    headers = {"Content-Type": "application/json"}
    try:
        async with session.post(url, data=body, headers=headers) as r:
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}: {(await r.text())[:200]}"
            elif not stream:
                data = await r.json(content_type=None)
                rec["ttft"] = time.perf_counter() - t0
                rec["tokens"] = data["usage"]["completion_tokens"]
            else:
                last = t0
                async for line in r.content:
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].strip()
                    if payload == b"[DONE]":
                        break
                    now = time.perf_counter()
                    event = loads(payload)
                    if "error" in event:
                        rec["error"] = f"stream error: {event['error'].get('message', '')[:200]}"
                    if event.get("usage"):
                        rec["tokens"] = event["usage"]["completion_tokens"]
                    choices = event.get("choices")
                    if choices and _has_text(choices[0]):
                        if rec["ttft"] is None:
                            rec["ttft"] = now - t0
                        else:
                            rec["gaps"].append(now - last)
                        last = now
    except Exception as e:  # a client-side failure counts as an error, never aborts the run
        rec["error"] = repr(e)[:200]
    rec["end"] = time.perf_counter()
    return rec


async def run_clients(url: str, work: list[bytes], clients: int, stream: bool, start_at: float):
    """`clients` closed-loop clients over `work` (taken in order); every request's record."""
    import aiohttp

    queue = list(reversed(work))
    records: list[dict] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))

        async def client() -> None:
            while queue:
                records.append(await one_request(session, url, queue.pop(), stream))

        await asyncio.gather(*(client() for _ in range(clients)))
    return records


def client_process(url: str, work: list[bytes], clients: int, stream: bool, start_at: float):
    """Entry point of one client process (spawned: imports neither torch nor the engine): its
    records and the CPU seconds the clients took."""
    cpu = time.process_time()
    records = asyncio.run(run_clients(url, work, clients, stream, start_at))
    return records, time.process_time() - cpu


def drive(pool, url: str, work: list[bytes], clients: int, stream: bool):
    """All clients over the client processes (`pool`, or this process when None): the records
    and the clients' CPU seconds (on a machine with few cores they compete with the server)."""
    start_at = time.perf_counter() + (1.0 if pool is not None else 0.0)
    if pool is None:
        return client_process(url, work, clients, stream, start_at)
    procs = pool.size
    jobs = [
        (url, work[i::procs], max(1, clients // procs + (i < clients % procs)), stream, start_at)
        for i in range(procs)
        if work[i::procs]
    ]
    parts = pool.starmap(client_process, jobs)
    return [rec for recs, _ in parts for rec in recs], sum(cpu for _, cpu in parts)
