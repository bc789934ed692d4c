"""What structured outputs cost: `pagoda serve` output tok/s with half the requests constrained by
a JSON Schema vs none, side by side in one run, plus the first-use compile time of typical
schemas and the host time of a step's bitmasks.

Throughput: a closed loop of `--concurrency` clients (default 32) on one server, each streaming
chat completions of at most `--max-tokens` (128) tokens back to back; the tokens streamed in a
`--seconds` window after a warm-up count, so the batch stays full and no run's tail decides the
result. "free": every request unconstrained (`ignore_eos`). "half": every other client sends
`response_format: json_schema` with an extraction schema (a list of cities with names, ISO
country patterns and populations; the JSON ends when the model closes it, or is steered closed
near max_tokens). The two run alternately `--rounds` times (drift of a shared machine hits
both) and the per-round ratios (and their median) are reported.

Compile: each typical schema compiled cold (a fresh compiler, no cache) in this process with the
embedded tokenizer, and again (a cache hit). Bitmasks: `GrammarBitmask.apply` for 16 constrained
rows of a 32-row batch of embedded-model logits (the host work a constrained step adds).

    .venv/bin/python benchmarks/structured_outputs.py            # ~6 min (6 pairs of 20 s)
    .venv/bin/python benchmarks/structured_outputs.py --quick    # ~2 min
    .venv/bin/python benchmarks/structured_outputs.py --serve-args "--device cuda"   # GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
# A typical extraction schema: at least 3 items (~50 tokens), more as the model likes, so a
# constrained answer is not much shorter than a free one (128 tokens).
EXTRACT = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "cities": {
            "type": "array",
            "minItems": 3,
            "maxItems": 60,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 30},
                    "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                    "population": {"type": "integer", "minimum": 0},
                },
                "required": ["name", "country", "population"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["topic", "cities"],
    "additionalProperties": False,
}
TYPICAL = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z]+\\.[a-z]{2,3}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
        "required": ["name", "age"], "additionalProperties": False},
    "extraction (cities)": EXTRACT,
    "tool call (2 tools)": None,  # filled in below: the required-tool grammar
}  # fmt: skip


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile("w+", prefix="pagoda-so-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [sys.executable, "-m", "pagoda.runtime.cli", "serve", "--port", str(port),
           "--max-model-len", "1024", "--log-level", "warning", *shlex.split(args.serve_args)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError("server not ready")


async def closed_loop(base: str, args: argparse.Namespace, constrained: bool) -> dict:
    """`concurrency` clients stream requests back to back (the odd ones constrained when
    `constrained`) for `warmup + seconds`; the tokens streamed in the last `seconds` count
    (one per content chunk: the server sends a chunk per token, holding back only a split
    multi-byte character), so the batch stays full and no request's tail is cut off."""
    window = {"start": 0.0, "end": 0.0}
    tokens = [0, 0]  # free, constrained, inside the window
    done, invalid, chunks_vs_usage, lengths = [0, 0], 0, [0, 0], [0, 0]

    async def one(http: httpx.AsyncClient, i: int, j: int, grammar: bool) -> None:
        nonlocal invalid
        body = {"model": MODEL, "max_tokens": args.max_tokens, "temperature": 0.8,
                "seed": 1000 * i + j, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"List cities of region {i}-{j} "
                              "as JSON."}]}  # fmt: skip
        if grammar:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "cities", "schema": EXTRACT}}  # fmt: skip
        else:
            body["ignore_eos"] = True
        text, chunks, usage = "", 0, None
        async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                data = json.loads(line[6:])
                if data.get("usage"):
                    usage = data["usage"]["completion_tokens"]
                for c in data["choices"]:
                    piece = c["delta"].get("content")
                    if piece:
                        text += piece
                        chunks += 1
                        if window["start"] <= time.perf_counter() < window["end"]:
                            tokens[grammar] += 1
        done[grammar] += 1
        lengths[grammar] += usage or 0
        chunks_vs_usage[0] += chunks
        chunks_vs_usage[1] += usage or 0
        if grammar:
            try:
                json.loads(text)
            except ValueError:
                invalid += 1

    async def client(i: int, http: httpx.AsyncClient) -> None:
        j = 0
        while time.perf_counter() < window["end"]:
            await one(http, i, j, constrained and i % 2 == 1)
            j += 1

    async with httpx.AsyncClient(timeout=600) as http:
        window["start"] = time.perf_counter() + args.warmup
        window["end"] = window["start"] + args.seconds
        await asyncio.gather(*(client(i, http) for i in range(args.concurrency)))
    return {"seconds": args.seconds, "tokens": sum(tokens), "free_tokens": tokens[0],
            "constrained_tokens": tokens[1], "free_requests": done[0],
            "constrained_requests": done[1], "invalid": invalid,
            "free_length": lengths[0] / max(done[0], 1),
            "constrained_length": lengths[1] / max(done[1], 1),
            "chunks_per_token": chunks_vs_usage[0] / max(chunks_vs_usage[1], 1)}  # fmt: skip


def compile_times() -> list[list[object]]:
    """Cold and cached compile of each typical schema with the embedded tokenizer."""
    from pagoda.runtime.server import tools
    from pagoda.runtime.server.protocol import ChatCompletionRequest
    from pagoda.runtime.structured.compiler import GrammarCompiler
    from pagoda.runtime.structured.params import StructuredOutputsParams as Spec

    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from structured_testlib import smol_tokenizer

    tok = smol_tokenizer()
    t = time.perf_counter()
    comp = GrammarCompiler(tok, tok.model_vocab_size)
    setup_s = time.perf_counter() - t
    req = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"},
                                             "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"]}}},
                  {"type": "function", "function": {"name": "add", "parameters": {
                      "type": "object", "properties": {"a": {"type": "integer"},
                                                       "b": {"type": "integer"}}}}}]})  # fmt: skip
    rows = [["tokenizer info (once per model)", f"{setup_s * 1e3:.1f}", "-"]]
    for name, schema in TYPICAL.items():
        if schema is None:
            t = time.perf_counter()
            spec = tools.tool_grammar("hermes", req.tools, None, parallel=True)
            build = time.perf_counter() - t
        else:
            spec, build = Spec(json=schema), 0.0
        t = time.perf_counter()
        comp.compile(spec)
        cold = time.perf_counter() - t + build
        t = time.perf_counter()
        comp.compile(spec)
        hit = time.perf_counter() - t
        rows.append([name, f"{cold * 1e3:.1f}", f"{hit * 1e6:.0f} us"])
    comp.close()
    return rows


def bitmask_cost(rows: int = 16, batch: int = 32, steps: int = 50) -> str:
    """Host time of `GrammarBitmask.apply` (catch-up + fill + apply) per step."""
    import torch
    from pagoda.runtime.request import Request
    from pagoda.runtime.sampling.params import SamplingParams
    from pagoda.runtime.structured.bitmask import GrammarBitmask
    from pagoda.runtime.structured.params import StructuredOutputsParams as Spec
    from structured_testlib import smol_tokenizer

    tok = smol_tokenizer()
    vocab = tok.model_vocab_size
    gb = GrammarBitmask(tok, vocab, torch.device("cpu"))
    spec = Spec(json=TYPICAL["person"])
    reqs = [Request(f"r{i}", [1], SamplingParams(max_tokens=4096, structured_outputs=spec
                                                 if i % 2 else None)) for i in range(batch)]  # fmt: skip
    grammar = [i for i in range(batch) if i % 2][:rows]
    logits = torch.randn(batch, vocab)
    gb.apply(logits.clone(), reqs, grammar)  # first use: states, closer's first look
    start = "{"
    for i in grammar:  # all inside a string: the common case, a non-trivial mask
        reqs[i].append_token(tok.encode(start)[0])
    times = []
    for _ in range(steps):
        x = logits.clone()
        t = time.perf_counter()
        gb.apply(x, reqs, grammar)
        times.append(time.perf_counter() - t)
    times.sort()
    return (f"{times[0] * 1e3:.2f} ms at best, {times[len(times) // 2] * 1e3:.2f} ms median "
            f"({steps} steps) for {rows} of {batch} rows")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per run")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds before the window")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=6, help="free/half pairs, alternating")
    p.add_argument("--serve-args", default="", help="extra `pagoda serve` flags")
    p.add_argument("--quick", action="store_true", help="2 rounds of 15 s windows")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.warmup = 2, 15.0, 5.0
    print(f"machine: {machine()} (shared with other work: compare the ratios)")
    print("\nfirst-use compile time, embedded tokenizer (vocabulary 49152):")
    ctimes = compile_times()
    print(markdown_table(["grammar", "cold compile (ms)", "cache hit"], ctimes))
    mask = bitmask_cost()
    print(f"\nbitmask fill + apply per step: {mask}")

    proc, base = start_server(args)
    try:
        warm = {**vars(args), "seconds": 1.0, "warmup": 0.0}  # compiles the schema, warms up
        asyncio.run(closed_loop(base, argparse.Namespace(**warm), True))
        runs: dict[str, list[dict]] = {"free": [], "half": []}
        for r in range(args.rounds):
            for name in ("free", "half"):
                res = asyncio.run(closed_loop(base, args, name == "half"))
                runs[name].append(res)
                print(f"round {r + 1} {name}: {res['tokens']} tokens in {res['seconds']:.0f} s "
                      f"= {res['tokens'] / res['seconds']:.1f} tok/s (chunks per token "
                      f"{res['chunks_per_token']:.3f})"
                      + (f"; constrained: {res['constrained_requests']} requests of "
                         f"{res['constrained_length']:.0f} tokens, {res['invalid']} not JSON"
                         if name == "half" else ""))  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    tps = {k: sum(x["tokens"] for x in v) / sum(x["seconds"] for x in v) for k, v in runs.items()}
    pairs = sorted(h["tokens"] / f["tokens"] for f, h in zip(runs["free"], runs["half"]))
    ratio = statistics.median(pairs)
    print()
    print(markdown_table(
        ["run", "output tok/s", "requests finished", "tokens / request"],
        [[f"{args.concurrency} clients, none constrained", f"{tps['free']:.1f}",
          sum(x["free_requests"] for x in runs["free"]),
          f"{sum(x['free_length'] for x in runs['free']) / len(runs['free']):.0f}"],
         [f"{args.concurrency} clients, half constrained", f"{tps['half']:.1f}",
          sum(x["free_requests"] + x["constrained_requests"] for x in runs["half"]),
          f"{sum(x['constrained_length'] for x in runs['half']) / len(runs['half']):.0f} "
          "(constrained)"]],
    ))  # fmt: skip
    print(
        f"\nhalf constrained / none, per round: {', '.join(f'{p:.3f}' for p in pairs)}; "
        f"median {ratio:.3f}; of the sums {tps['half'] / tps['free']:.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "compile": ctimes,
                                               "bitmask": mask, "runs": runs, "tok_s": tps,
                                               "ratio": ratio}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
