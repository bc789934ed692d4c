"""Serving benchmark: `pagoda serve` vs llama.cpp's own `llama-server` on the same GGUF, one run.

The llama.cpp peer is `llama-server` with parallel slots and continuous batching (`-np 32 -cb`),
built on demand from the llama.cpp sources vendored in the llama-cpp-python sdist and cached in
~/.cache/pagoda (see benchmarks/llama_server.py; the first build takes ~9 min). llama-cpp-python's
own server, which serves one request at a time, can be added as a second, labelled column
(`--systems pagoda,llama-server,llama-cpp-python`); it is not the strong llama.cpp baseline.

All servers run side by side on loopback; every scenario runs on each system in turn before the
next scenario starts, so slow drift of a shared machine hits all alike. Clients stream
`/v1/completions` with ragged prompts (log-uniform lengths, a shared 64-token preamble) and a
fixed number of output tokens (`ignore_eos`; an EOS `logit_bias` for llama-cpp-python).

Scenarios: Poisson arrivals at several request rates, and a closed loop at fixed concurrency.
Reported per scenario: output tokens/s (aggregate), requests/s, TTFT and inter-token latency
p50/p90/p99 (client side, first/next non-empty text chunk), plus a PNG of latency vs rate.

    .venv/bin/python benchmarks/serving.py                       # ~15 min on 2 busy cores
    .venv/bin/python benchmarks/serving.py --quick               # ~6 min
    .venv/bin/python benchmarks/serving.py --systems pagoda      # without the peer

The llama-cpp-python column needs `pip install 'llama-cpp-python[server]'`; without it that
column is skipped with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine
from llama_server import build_llama_server

ROOT = Path(__file__).resolve().parents[1]
PREAMBLE = 64
# A fresh connection per request: llama-server closes idle keep-alive connections, and a request
# sent on one just closed fails ("Server disconnected") through no fault of the server's speed.
LIMITS = httpx.Limits(max_connections=512, max_keepalive_connections=0)


@dataclass
class Result:
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float = 0.0
    tokens: int = 0
    error: str | None = None


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# -- workload ----------------------------------------------------------------------------------
def load_tokenizer(gguf_path: Path):
    """Only the tokenizer (no weights): the client process stays light."""
    import gguf
    from pagoda.runtime.model.gguf_loader import read_config, read_tokenizer

    reader = gguf.GGUFReader(str(gguf_path))
    return read_tokenizer(reader, read_config(reader))


def ragged_prompts(tok, n: int, min_len: int, max_len: int, seed: int) -> list[str]:
    """Text prompts of log-uniform token lengths cut from this repository's sources."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "runtime").rglob("*.py")))
    corpus = tok.encode(text, add_special_tokens=False)
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = round(math.exp(rng.uniform(math.log(min_len), math.log(max_len))))
        start = rng.randrange(PREAMBLE, len(corpus) - max_len)
        ids = corpus[:PREAMBLE] + corpus[start : start + max(1, length - PREAMBLE)]
        prompts.append(tok.decode(ids[:length]))
    return prompts


# -- servers -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.name, self.port = name, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{name}-", suffix=".log")  # noqa: SIM115
        cmd = [c.replace("{port}", str(self.port)) for c in cmd]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def wait(self, path: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited:\n{self.log.read()[-3000:]}")
            try:
                if httpx.get(self.base + path, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not start in {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def start_servers(args: argparse.Namespace, gguf_path: Path) -> list[Server]:
    # Both get passive OpenMP waiting (pagoda serve's default): on busy shared cores spinning
    # threads slow either system several-fold (measured: the peer 4.7 vs 9.8 tok/s at 8 clients).
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    servers = []
    if "pagoda" in args.systems:
        cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", "{port}",
               "--model", "smollm2-135m", "--max-model-len", "2048", "--kv-cache-memory", "768MiB",
               "--log-level", "warning", *args.pagoda_args.split()]  # fmt: skip
        servers.append(Server("pagoda", cmd, env))
    if "llama-server" in args.systems:
        binary = build_llama_server()  # cached; the first build takes minutes
        ctx = str(args.llama_slots * 2048)  # per slot: Pagoda's --max-model-len
        cmd = [str(binary), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", "{port}",
               "-np", str(args.llama_slots), "-c", ctx, "-cb", "-t", str(args.llama_threads),
               "-tb", str(args.llama_threads)]  # fmt: skip
        servers.append(Server("llama-server", cmd, env))
    if "llama-cpp-python" in args.systems:
        if (
            importlib.util.find_spec("llama_cpp") is None
            or importlib.util.find_spec("sse_starlette") is None
        ):
            print("llama-cpp-python column skipped: pip install 'llama-cpp-python[server]'")
        else:
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path),
                   "--host", "127.0.0.1", "--port", "{port}", "--n_ctx", "2048",
                   "--n_threads", str(args.llama_threads), "--n_threads_batch", str(args.llama_threads),
                   "--interrupt_requests", "False"]  # fmt: skip
            servers.append(Server("llama-cpp-python", cmd, env))
    ready = {"pagoda": "/ready", "llama-server": "/health", "llama-cpp-python": "/v1/models"}
    for s in servers:
        s.wait(ready[s.name])
    return servers


# -- clients -----------------------------------------------------------------------------------
def request_body(
    system: str,
    prompt: str,
    out_len: int,
    eos_ids: list[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> dict:
    """A streaming completion of exactly `out_len` tokens; with a temperature, drawn from the
    whole vocabulary, or its top-p nucleus (llama.cpp's default top-k 40, top-p 0.95 and min-p
    0.05 turned off, so both servers apply the same filter)."""
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": out_len,
            "temperature": temperature, "stream": True}  # fmt: skip
    if system == "llama-cpp-python":  # its server has no ignore_eos
        body["logit_bias"] = {str(t): -100.0 for t in eos_ids}
    else:
        body["ignore_eos"] = True
    if temperature > 0 and system != "pagoda":
        body.update(top_k=0, top_p=1.0, min_p=0.0)
    if temperature > 0 and top_p < 1.0:
        body["top_p"] = top_p
    return body


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> Result:
    res, t0 = Result(), time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if not choices[0].get("text"):
                    continue
                now = time.perf_counter()
                if res.ttft is None:
                    res.ttft = now - t0
                else:
                    res.gaps.append(now - last)
                last = now
                res.tokens += 1
    except httpx.HTTPError as e:
        res.error = repr(e)
    res.e2e = time.perf_counter() - t0
    return res


async def run_poisson(server: Server, bodies: list[dict], rate: float, seed: int) -> tuple:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=1800, limits=LIMITS) as c:
        url, tasks, start = server.base + "/v1/completions", [], time.perf_counter()
        for body in bodies:
            tasks.append(asyncio.ensure_future(one_request(c, url, body)))
            await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


async def run_concurrency(server: Server, bodies: list[dict], concurrency: int) -> tuple:
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    results: list[Result] = []
    async with httpx.AsyncClient(timeout=1800, limits=LIMITS) as c:
        url, start = server.base + "/v1/completions", time.perf_counter()

        async def worker() -> None:
            while not queue.empty():
                results.append(await one_request(c, url, queue.get_nowait()))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - start


def summarize(system: str, mode: str, load: float, results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.error is None and r.ttft is not None]
    ttft = [r.ttft for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    row = {"system": system, "mode": mode, "load": load, "requests": len(results),
           "errors": len(results) - len(ok), "seconds": wall,
           "tok_s": sum(r.tokens for r in ok) / wall, "req_s": len(ok) / wall,
           "error_kinds": sorted({r.error or "no text" for r in results if r not in ok})[:3]}  # fmt: skip
    for q in (50, 90, 99):
        row[f"ttft_p{q}"] = pct(ttft, q)
        row[f"itl_p{q}"] = pct(gaps, q)
    return row


# -- report ------------------------------------------------------------------------------------
def table(rows: list[dict]) -> str:
    head = ["system", "mode", "load", "req", "err", "out tok/s", "req/s", "TTFT p50/p90/p99 (s)",
            "ITL p50/p90/p99 (ms)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        load = f"{r['load']:g} req/s" if r["mode"] == "poisson" else f"{r['load']:g} clients"
        ttft = "/".join(f"{r[f'ttft_p{q}']:.2f}" for q in (50, 90, 99))
        itl = "/".join(f"{1000 * r[f'itl_p{q}']:.0f}" for q in (50, 90, 99))
        cells = [r["system"], r["mode"], load, r["requests"], r["errors"], f"{r['tok_s']:.1f}",
                 f"{r['req_s']:.2f}", ttft, itl]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def verdict(rows: list[dict], concurrency: int) -> str:
    """Pagoda against each peer at `concurrency` clients; the target is against llama-server."""
    at = {r["system"]: r for r in rows if r["mode"] == "concurrency" and r["load"] == concurrency}
    if "pagoda" not in at or len(at) < 2:
        return f"(no side-by-side result at {concurrency} clients)"
    ours, lines = at["pagoda"], []
    for name, peer in at.items():
        if name == "pagoda":
            continue
        ratio = ours["tok_s"] / peer["tok_s"]
        line = (
            f"At {concurrency} concurrent clients: Pagoda {ours['tok_s']:.1f} vs {name} "
            f"{peer['tok_s']:.1f} output tok/s = {ratio:.2f}x; p99 TTFT "
            f"{ours['ttft_p99']:.2f} s vs {peer['ttft_p99']:.2f} s."
        )
        if name == "llama-server":
            ok = ratio >= 2 and ours["ttft_p99"] < peer["ttft_p99"]
            line += f" Target (>= 2x, lower p99 TTFT) {'MET' if ok else 'MISSED'}."
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for system, style in (("pagoda", "-o"), ("llama-server", "--s"), ("llama-cpp-python", ":^")):
        pts = sorted((r for r in rows if r["system"] == system and r["mode"] == "poisson"),
                     key=lambda r: r["load"])  # fmt: skip
        if not pts:
            continue
        x = [r["load"] for r in pts]
        for q in (50, 99):
            axes[0].plot(x, [r[f"ttft_p{q}"] for r in pts], style, label=f"{system} p{q}")
            axes[1].plot(x, [1000 * r[f"itl_p{q}"] for r in pts], style, label=f"{system} p{q}")
        axes[2].plot(x, [r["tok_s"] for r in pts], style, label=system)
    titles = ("TTFT (s)", "inter-token latency (ms)", "output tokens/s")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default="pagoda,llama-server",
                   help="comma list of pagoda, llama-server, llama-cpp-python")  # fmt: skip
    p.add_argument("--llama-slots", type=int, default=32, help="llama-server parallel slots")
    p.add_argument("--rates", default="0.25,0.5,1,2", help="Poisson request rates (req/s)")
    p.add_argument("--num-prompts", type=int, default=24, help="requests per Poisson rate")
    p.add_argument("--concurrency", default="8,32", help="closed-loop client counts")
    p.add_argument("--rounds", type=int, default=2, help="requests per client in closed loop")
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (every system)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llama-threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--pagoda-args", default="", help="extra `pagoda serve` flags")
    p.add_argument("--plot", default=str(ROOT / "docs" / "serving-latency.png"))
    p.add_argument("--json", default=None, help="write every row as JSON here")
    p.add_argument("--quick", action="store_true", help="rates 0.5,2; 16 prompts; 32 tokens out")
    args = p.parse_args(argv)
    if args.quick:
        args.rates, args.num_prompts, args.output_len = "0.5,2", 16, 32
    args.systems = args.systems.split(",")
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    if not 0.0 < args.top_p <= 1.0:
        p.error("--top-p must be in (0, 1]")
    unknown = set(args.systems) - {"pagoda", "llama-server", "llama-cpp-python"}
    if unknown:
        p.error(f"unknown system(s): {', '.join(sorted(unknown))}")
    return args


async def scenarios(args: argparse.Namespace, servers: list[Server], tok) -> list[dict]:
    rows = []
    eos = list(tok.eos_token_ids)
    rates = [float(r) for r in args.rates.split(",") if r]
    concs = [int(c) for c in args.concurrency.split(",") if c]
    plan = [("poisson", r, args.num_prompts) for r in rates]
    plan += [("concurrency", c, c * args.rounds) for c in concs]
    for i, (mode, load, n) in enumerate(plan):
        prompts = ragged_prompts(tok, n, args.min_len, args.max_len, args.seed + i)
        for s in servers:
            bodies = [
                request_body(s.name, p, args.output_len, eos, args.temperature, args.top_p)
                for p in prompts
            ]
            if mode == "poisson":
                results, wall = await run_poisson(s, bodies, load, args.seed + i)
            else:
                results, wall = await run_concurrency(s, bodies, int(load))
            rows.append(summarize(s.name, mode, load, results, wall))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pagoda.runtime.model.loader import builtin_model_path

    gguf_path = builtin_model_path("smollm2-135m")
    tok = load_tokenizer(gguf_path)
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"machine: {machine()}")
    servers = start_servers(args, gguf_path)
    try:
        for s in servers:  # warm-up: first-call costs are not part of any scenario
            body = request_body(s.name, "Hello there", 4, list(tok.eos_token_ids))
            asyncio.run(run_concurrency(s, [body, body], 2))
        rows = asyncio.run(scenarios(args, servers, tok))
    finally:
        for s in servers:
            s.stop()
    sampling = f"temperature {args.temperature}" if args.temperature > 0 else "greedy"
    sampling += f", top-p {args.top_p}" if args.temperature > 0 and args.top_p < 1 else ""
    print(f"\n## Serving ({started}, {machine()}, {sampling}, load average "
          f"{os.getloadavg()[0]:.1f} at the end)\n")  # fmt: skip
    print(table(rows))
    print("\n" + verdict(rows, 32))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot and any(r["mode"] == "poisson" for r in rows):
        plot(rows, Path(args.plot))
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
