"""The server path of `vision_serving.py`: `pagoda serve` on its random Qwen2-VL, prefix caching
on and off (two servers side by side; the encoder cache at its default size in both: the server
has no switch for it), `--clients` concurrent clients of the openai SDK streaming
`/v1/chat/completions`, each request a question about one picture sent as an `image_url` data URL
(PNG, base64): `--requests` requests over `--images` shared pictures, then over as many distinct
pictures as requests, each workload on each server in turn, `--rounds` times.

Each round sends new pictures, so every workload starts with cold caches (after one unmeasured
batch of `--clients` requests per server). Reported per server
and workload: images the tower encoded (the server's
`pagoda:mm_encoder_cache_queries` less `..._hits` over the run), requests/s, output tok/s, and
the time to the first token at the client (its first non-empty content chunk), median and 99th
percentile; medians of the rounds.

    .venv/bin/python -P benchmarks/vision_serving_server.py [--requests 32] [--images 4]
        [--clients 8] [--size 336] [--tokens 16] [--rounds 2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import asyncio
import base64
import io
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from serving import Server
from vision_serving import parse, pictures, timing_cells, workload_args, write_checkpoint

ENCODER = ("pagoda:mm_encoder_cache_queries", "pagoda:mm_encoder_cache_hits")


def data_url(picture) -> str:
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def encoder_counts(base: str) -> tuple[float, float]:
    """The server's encoder-cache counters (queries, hits), read from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    got = dict.fromkeys(ENCODER, 0.0)
    text = httpx.get(f"{base}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name in got:
            got[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return got[ENCODER[0]], got[ENCODER[1]]


async def clients(base: str, model: str, urls: list[str], args) -> tuple[float, list[float], int]:
    """(seconds, each request's TTFT, output tokens): `--clients` clients take the requests in
    order, back to back."""
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    todo = iter(enumerate(urls))
    ttft: list[float] = []
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        for i, url in todo:
            question = " ".join(f"w{(37 * i + 11 * j) % 900 + 10}" for j in range(16))
            content = [{"type": "image_url", "image_url": {"url": url}},
                       {"type": "text", "text": question}]  # fmt: skip
            t, first = time.perf_counter(), None
            stream = await api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": content}], stream=True,
                max_tokens=args.tokens, temperature=0, extra_body={"ignore_eos": True},
                stream_options={"include_usage": True},
            )  # fmt: skip
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - t
                if chunk.usage:
                    tokens += chunk.usage.completion_tokens
            ttft.append(first)

    t = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    seconds = time.perf_counter() - t
    await api.close()
    assert None not in ttft, "a request streamed no content"
    return seconds, sorted(ttft), tokens


def measure(server: Server, model: str, urls: list[str], args) -> dict:
    before = encoder_counts(server.base)
    seconds, ttft, tokens = asyncio.run(clients(server.base, model, urls, args))
    after = encoder_counts(server.base)
    encoded = (after[0] - before[0]) - (after[1] - before[1])
    return dict(seconds=seconds, ttft=ttft, tokens=tokens, encoded=int(encoded))


def main(argv: list[str] | None = None) -> int:
    ap = workload_args(__doc__)
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    args = parse(ap, argv)
    print(machine(), f"load {os.getloadavg()[0]:.1f}", flush=True)
    path = Path(tempfile.mkdtemp(prefix="vision-serving-server-"))
    write_checkpoint(path)
    shared, distinct = f"{args.images} shared", f"{args.requests} distinct"
    env = {"OMP_WAIT_POLICY": os.environ["OMP_WAIT_POLICY"]}
    servers = {}
    for label, flag in (("prefix off", "--no-enable-prefix-caching"),
                        ("prefix on", "--enable-prefix-caching")):  # fmt: skip
        cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port", "{port}",
               "--model", str(path), "--dtype", "float32", "--max-model-len", "1024",
               "--kv-cache-memory", "256MiB", "--log-level", "warning", flag]  # fmt: skip
        servers[label] = Server(f"vision-{label.replace(' ', '-')}", cmd, env)
    rows = []
    try:
        for s in servers.values():
            s.wait("/ready")
        model = httpx.get(f"{servers['prefix on'].base}/v1/models").json()["data"][0]["id"]
        warm = [data_url(p) for p in pictures(args.clients, args.size, seed=0)]
        for server in servers.values():  # a first batch pays one-time costs: not measured
            measure(server, model, warm, args)
        got = {(w, s): [] for w in (shared, distinct) for s in servers}
        for r in range(args.rounds):  # new pictures each round: the caches start cold
            few = [data_url(p) for p in pictures(args.images, args.size, seed=2 * r + 1)]
            many = [data_url(p) for p in pictures(args.requests, args.size, seed=2 * r + 2)]
            workloads = {shared: [few[i % args.images] for i in range(args.requests)],
                         distinct: many}  # fmt: skip
            for w, urls in workloads.items():
                for label, server in servers.items():
                    got[w, label].append(measure(server, model, urls, args))
        for (w, label), runs in got.items():
            cells = timing_cells(runs, args.requests, runs[0]["tokens"])
            rows.append([w, label, str(runs[0]["encoded"]), *cells])
    finally:
        for s in servers.values():
            s.stop()
    print(markdown_table(["pictures", "server", "images encoded", "requests/s",
                          "output tok/s", "TTFT p50 s", "TTFT p99 s"], rows))  # fmt: skip
    print(f"{args.requests} requests, {args.clients} clients, {args.size} px pictures, "
          f"{args.tokens} new tokens each, medians of {args.rounds}; "
          f"load {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
