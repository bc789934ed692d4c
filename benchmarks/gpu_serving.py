"""Serving over HTTP against the offline engine: streaming and not, side by side, in one run.

`pagoda serve` (one process per `--servers` entry, all started at once) is driven by N
concurrent HTTP clients: aiohttp, spread over `--client-procs` processes so that the clients'
own Python is not the limit. The clients run a **closed loop**: each sends its next request when
its previous one has completed; with at least as many clients as requests every request is sent
at once, as nano-vllm's bench.py hands all 256 to its engine. Workloads:

- `nano`: nano-vllm's bench.py on `/v1/completions`: random token ids as the prompt, input and
  output lengths uniform in [min-len, max-len] (100-1024), temperature 0.6, `ignore_eos`;
- `chat`: a chat-like mix on `/v1/chat/completions`: one system prompt all requests share
  (64 tokens, a prefix-cache hit), user turns log-uniform in [16, max-len - 96] tokens, replies
  log-uniform in [16, max-len / 2], temperature 0.6, `ignore_eos` (smaller with a small
  max-len).

Each workload runs with `stream: false` and `stream: true` on every server in turn, for
`--rounds` rounds, so that drift of a shared machine hits all alike. Reported per run: output
tok/s (the completion tokens of every response's `usage` over the wall time from the first
request sent to the last response read), TTFT (the first SSE event carrying text; the whole
response without streaming), ITL (between SSE events carrying text: one event can carry several
tokens when the server coalesces them for a client reading slower than they are made), TPOT
((end - TTFT) / (tokens - 1), per request), the server's CPU time per output token (its
processes' user + system time from /proc: what the HTTP side costs, even on a machine whose
other load makes throughput noisy) and that of its API process alone (with the engine in a
process of its own: the HTTP side's cost per token); the streaming/non-streaming throughput ratio; each
server's start-to-ready time (process start to `/ready` 200); and the offline engine's figure
(`LLM` through gpu_throughput.run_pagoda) on the same model and `nano` requests, measured in this
process before the servers start.

    python -P benchmarks/gpu_serving.py                      # GPU: Llama-3.2-1B-shaped, 256 clients
    python -P benchmarks/gpu_serving.py --model smollm2-135m # CPU: embedded model, 32 clients
    python -P benchmarks/gpu_serving.py --servers thread=--no-engine-process process=  # A/B
    python -P benchmarks/gpu_serving.py --tiny               # smoke run (seconds, CI)

On a CUDA device the defaults are nano-vllm's (a random Llama-3.2-1B-shaped model written to a
temporary directory, 256 requests, 256 clients); on a CPU the embedded SmolLM2-135M with 32
requests of 16-128 tokens and 32 clients. `--py-spy FILE` records the first server's processes
with py-spy during its first streaming run (where py-spy is installed and may attach).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import asyncio
import json
import math
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_TOKENS = 64  # the chat mix's shared system prompt
# A chat template for the random models (their tokenizer has none): ChatML, as SmolLM2's.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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


# -- servers ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `pagoda serve` process on a free loopback port; its start-to-ready time and log."""

    def __init__(self, label: str, flags: list[str]) -> None:
        self.label, self.port = label, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="gpu-serving-", suffix=".log")  # noqa: SIM115
        cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--port",
               str(self.port), *flags]  # fmt: skip
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.ready_s: float | None = None

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def poll_ready(self) -> bool:
        if self.ready_s is not None:
            return True
        if self.proc.poll() is not None:
            raise RuntimeError(f"server {self.label!r} exited:\n{self.output()[-4000:]}")
        try:
            with urllib.request.urlopen(self.base + "/ready", timeout=2) as r:
                if r.status == 200:
                    self.ready_s = time.perf_counter() - self.started
        except OSError:
            pass
        return self.ready_s is not None

    def pids(self) -> list[int]:
        """The server's process and its children (an engine process, where there is one)."""
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            kids = ""
        return [self.proc.pid, *map(int, kids.split())]

    def cpu_seconds(self, api_only: bool = False) -> float:
        """User + system CPU time of the server's processes so far (from /proc; 0 elsewhere);
        `api_only`: of the HTTP (API) process alone, without an engine process."""
        total = 0.0
        for pid in self.pids()[:1] if api_only else self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def start_servers(specs: list[str], common: list[str], timeout: float) -> list[Server]:
    servers = []
    for spec in specs:  # "FLAGS" or "LABEL=FLAGS" (a label lets flags start with "--")
        label, eq, flags = spec.partition("=")
        if not eq or label.startswith("-"):
            label, flags = spec.strip() or "default", spec
        servers.append(Server(label, [*common, *flags.split()]))
    deadline = time.perf_counter() + timeout
    try:
        while not all(s.poll_ready() for s in servers):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"servers not ready after {timeout:.0f} s")
            time.sleep(0.05)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def startup_lines(server: Server) -> list[str]:
    """The server log's start-up breakdown and warm-up lines."""
    keys = ("start-up", "warm-up", "ready:")
    return [ln.strip() for ln in server.output().splitlines() if any(k in ln for k in keys)]


# -- statistics and report -------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(records: list[dict]) -> dict:
    ok = [r for r in records if r["error"] is None and r["ttft"] is not None]
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    tokens = sum(r["tokens"] for r in ok)
    tpot = [(r["end"] - r["start"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    gaps = [g for r in ok for g in r["gaps"]]
    row = {"requests": len(records), "errors": len(records) - len(ok), "seconds": wall,
           "tokens": tokens, "tok_s": tokens / wall if wall > 0 else 0.0,
           "events_per_token": (sum(len(r["gaps"]) + 1 for r in ok) / tokens) if tokens else 0.0,
           "error_kinds": sorted({r["error"] or "no text" for r in records if r not in ok})[:3]}  # fmt: skip
    for q in (50, 90, 99):
        row[f"ttft_p{q}"] = pct([r["ttft"] for r in ok], q)
        row[f"itl_p{q}"] = pct(gaps, q)
        row[f"tpot_p{q}"] = pct(tpot, q)
    return row


def fmt_row(r: dict) -> list[str]:
    ttft = "/".join(f"{r[f'ttft_p{q}']:.2f}" for q in (50, 90, 99))
    itl = "/".join(f"{1e3 * r[f'itl_p{q}']:.1f}" for q in (50, 90, 99)) if r["stream"] else "-"
    tpot = "/".join(f"{1e3 * r[f'tpot_p{q}']:.1f}" for q in (50, 99)) if r["stream"] else "-"
    events = f"{r['events_per_token']:.2f}" if r["stream"] else "-"
    return [r["server"], r["workload"], "yes" if r["stream"] else "no", r["round"],
            r["requests"], r["errors"], f"{r['tok_s']:.1f}", ttft, itl, tpot, events,
            f"{r['cpu_ms_per_token']:.2f}", f"{r['api_cpu_us_per_token']:.0f}",
            f"{r['client_cpu_us_per_token']:.0f}"]  # fmt: skip


HEADERS = ["server", "workload", "stream", "round", "req", "err", "out tok/s",
           "TTFT p50/p90/p99 (s)", "ITL p50/p90/p99 (ms)", "TPOT p50/p99 (ms)",
           "events/token", "server CPU ms/token", "API process CPU µs/token",
           "client CPU µs/token"]  # fmt: skip


def _median(rows: list[dict], key: str, where: tuple) -> float:
    """The median of `key` over the rounds of one (server, workload, stream)."""
    vals = [r[key] for r in rows if (r["server"], r["workload"], r["stream"]) == where]
    return statistics.median(vals) if vals else float("nan")


def ratios(rows: list[dict], offline: float | None) -> list[str]:
    """Streaming over non-streaming throughput per server and workload (medians of the
    rounds), and each against the offline engine."""
    lines = []
    for server in dict.fromkeys(r["server"] for r in rows):
        for wl in dict.fromkeys(r["workload"] for r in rows):
            med, cpu, client = (
                {st: _median(rows, key, (server, wl, st)) for st in (False, True)}
                for key in ("tok_s", "cpu_ms_per_token", "client_cpu_us_per_token")
            )
            line = (
                f"{server} {wl}: streaming {med[True]:.1f} / non-streaming {med[False]:.1f} "
                f"tok/s = {med[True] / med[False]:.2f}x (server CPU {cpu[True]:.2f} / "
                f"{cpu[False]:.2f} ms per token, clients {client[True]:.0f} / "
                f"{client[False]:.0f} µs)"
            )
            if offline and wl == "nano":
                line += (
                    f"; offline engine {offline:.1f} tok/s (streaming {med[True] / offline:.2f}x, "
                    f"non-streaming {med[False] / offline:.2f}x of it)"
                )
            lines.append(line)
    return lines


# -- model and offline run -------------------------------------------------------------------
def prepare_model(args, tmp: Path):
    """(model path or name for the server, the loaded model, word maker, vocab size)."""
    import torch
    from common import write_random_llama
    from gpu_throughput import SHAPES
    from pagoda.runtime.model.loader import load_model

    if args.model:
        loaded = load_model(args.model)
        return args.model, loaded, corpus_text(loaded.tokenizer), loaded.config.vocab_size
    cfg = SHAPES[args.shape]
    path = tmp / "model"
    path.mkdir()
    write_random_llama(path, cfg, torch.bfloat16)
    (path / "chat_template.jinja").write_text(CHATML)
    return str(path), load_model(str(path)), word_text(cfg["vocab_size"]), cfg["vocab_size"]


def offline_run(loaded, reqs, args) -> dict:
    """gpu_throughput.run_pagoda on the same requests and engine limits as the servers."""
    import gc

    import gpu_throughput
    import torch

    ns = argparse.Namespace(
        kv_cache_gib=args.kv_cache_gib, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_len=args.max_len,
    )  # fmt: skip
    res = gpu_throughput.run_pagoda(loaded, reqs, ns)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return res


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import torch

    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model the server can load (default on CPU: smollm2-135m)")
    ap.add_argument(
        "--shape", help="a random model of gpu_throughput's SHAPES (default on CUDA: 1b)"
    )
    ap.add_argument(
        "--tiny", action="store_true", help="smoke run: tiny random model, few requests"
    )
    ap.add_argument("--workloads", nargs="+", choices=["nano", "chat"], default=["nano", "chat"])
    ap.add_argument("--num-requests", type=int, help="per workload (256 on CUDA, 32 on CPU)")
    ap.add_argument("--clients", type=int, help="concurrent clients (256 on CUDA, 32 on CPU)")
    ap.add_argument("--min-len", type=int, help="nano: min input/output tokens (100; CPU 16)")
    ap.add_argument("--max-len", type=int, help="nano: max input/output tokens (1024; CPU 128)")
    ap.add_argument("--rounds", type=int, default=1, help="streaming/non-streaming rounds")
    ap.add_argument("--servers", nargs="+", default=[""],
                    help="one server per entry, each with these extra `pagoda serve` flags "
                         "(LABEL=FLAGS names it)")  # fmt: skip
    ap.add_argument("--server-args", default="", help="extra flags for every server")
    ap.add_argument("--client-procs", type=int, help="client processes (4 on CUDA, 1 on CPU)")
    ap.add_argument("--max-num-seqs", type=int, help="engine batch (256 on CUDA, 32 on CPU)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--kv-cache-gib", type=float, help="KV cache per engine (32 CUDA, 0.5 CPU)")
    ap.add_argument("--no-offline", action="store_true", help="skip the offline engine's run")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows and figures as JSON here")
    ap.add_argument("--py-spy", metavar="FILE", help="py-spy record of the first streaming run")
    args = ap.parse_args(argv)
    if args.model and args.shape:
        ap.error("--model or --shape, not both")
    big = cuda and not args.tiny
    if args.tiny:
        args.model, args.shape = None, "tiny"
    elif not args.model and not args.shape:
        args.shape, args.model = ("1b", None) if cuda else (None, "smollm2-135m")
    tiny = dict(num_requests=6, clients=4, min_len=8, max_len=24, client_procs=1, max_num_seqs=8,
                kv_cache_gib=0.0625, max_num_batched_tokens=256)  # fmt: skip
    gpu = dict(num_requests=256, clients=256, min_len=100, max_len=1024, client_procs=4,
               max_num_seqs=256, kv_cache_gib=32.0, max_num_batched_tokens=16384)  # fmt: skip
    cpu = dict(num_requests=32, clients=32, min_len=16, max_len=128, client_procs=1,
               max_num_seqs=32, kv_cache_gib=0.5, max_num_batched_tokens=2048)  # fmt: skip
    for k, v in (tiny if args.tiny else gpu if big else cpu).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def run(args, servers: list[Server], work: dict, pool) -> list[dict]:
    rows, spied = [], False
    for rnd in range(args.rounds):
        for wl, reqs in work.items():
            for stream in (False, True):
                payloads = bodies(wl, reqs, stream, "bench")
                path = "/v1/completions" if wl == "nano" else "/v1/chat/completions"
                for s in servers:
                    spy = None
                    if args.py_spy and stream and not spied:
                        spy, spied = py_spy(s, args.py_spy), True
                    cpu, api = s.cpu_seconds(), s.cpu_seconds(api_only=True)
                    records, client_cpu = drive(pool, s.base + path, payloads, args.clients, stream)
                    cpu, api = s.cpu_seconds() - cpu, s.cpu_seconds(api_only=True) - api
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(60)
                    row = {"server": s.label, "workload": wl, "stream": stream, "round": rnd,
                           **summarize(records)}  # fmt: skip
                    row["cpu_ms_per_token"] = 1e3 * cpu / max(1, row["tokens"])
                    row["api_cpu_us_per_token"] = 1e6 * api / max(1, row["tokens"])
                    row["client_cpu_us_per_token"] = 1e6 * client_cpu / max(1, row["tokens"])
                    rows.append(row)
                    print("| " + " | ".join(str(c) for c in fmt_row(row)) + " |", flush=True)
    return rows


FORMATS = {".svg": "flamegraph", ".json": "speedscope"}  # else collapsed stacks (text)


def py_spy(server: Server, out: str):
    exe = shutil.which("py-spy")
    if exe is None:
        print("--py-spy: py-spy is not installed; no profile")
        return None
    cmd = [exe, "record", "-o", out, "--pid", str(server.proc.pid), "--subprocesses",
           "--rate", "200", "--threads", "--format", FORMATS.get(Path(out).suffix, "raw")]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from common import machine

    print(f"machine: {machine()}")
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    result: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory() as tmp:
        model, loaded, words, vocab = prepare_model(args, Path(tmp))
        nano = nano_requests(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
        work = {
            "nano": nano,
            "chat": chat_requests(args.num_requests, args.max_len, words, args.seed),
        }
        work = {k: v for k, v in work.items() if k in args.workloads}
        print(f"model {model}; {args.num_requests} requests per workload, {args.clients} "
              f"clients (closed loop) in {args.client_procs} process(es)")  # fmt: skip
        if not args.no_offline and "nano" in work:
            off = offline_run(loaded, nano, args)
            result["offline"] = off
            print(f"offline engine, nano: {off['output_tokens']} tokens in {off['seconds']:.2f} s "
                  f"= {off['tok_s']:.1f} tok/s ({off['num_steps']} steps)")  # fmt: skip
        del loaded
        common = ["--model", model, "--served-model-name", "bench",
                  "--max-model-len", str(2 * args.max_len + 1),
                  "--max-num-seqs", str(args.max_num_seqs),
                  "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                  "--kv-cache-memory", f"{int(args.kv_cache_gib * 1024)}MiB",
                  "--max-queue-len", str(max(512, 2 * args.num_requests)),
                  "--log-level", "info", *args.server_args.split()]  # fmt: skip
        servers = start_servers(args.servers, common, args.ready_timeout)
        pool = None
        try:
            for s in servers:
                print(f"server {s.label!r}: ready {s.ready_s:.1f} s after its start")
                for line in startup_lines(s):
                    print(f"  {line}")
            if args.client_procs > 1:
                import multiprocessing

                pool = multiprocessing.get_context("spawn").Pool(args.client_procs)
                pool.size = args.client_procs
            for s in servers:  # first-request costs are not part of any run
                drive(pool, s.base + "/v1/completions", bodies("nano", nano[:2], True, "bench"),
                      2, True)  # fmt: skip
            print("\n| " + " | ".join(HEADERS) + " |\n|" + "---|" * len(HEADERS))
            rows = run(args, servers, work, pool)
        finally:
            if pool is not None:
                pool.close()
            for s in servers:
                s.stop()
    offline = result.get("offline", {}).get("tok_s")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    for line in ratios(rows, offline):
        print(line)
    result.update(rows=rows, ready_s={s.label: s.ready_s for s in servers})
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
