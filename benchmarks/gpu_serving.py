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
    python -P benchmarks/gpu_serving.py --old-ref REF        # each server as REF and as now

On a CUDA device the defaults are nano-vllm's (a random Llama-3.2-1B-shaped model written to a
temporary directory, 256 requests, 256 clients); on a CPU the embedded SmolLM2-135M with 32
requests of 16-128 tokens and 32 clients. `--py-spy FILE` records the first server's processes
with py-spy during its first streaming run (where py-spy is installed and may attach).

Its parts: gpu_serving_load.py (the workloads and the clients), gpu_serving_servers.py (the
`pagoda serve` processes), gpu_serving_report.py (each run's summary, the table, the ratios).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_serving_load import bodies, chat_requests, corpus_text, drive, nano_requests, word_text
from gpu_serving_report import HEADERS, fmt_row, ratios, summarize
from gpu_serving_servers import Server, start_servers, startup_lines

# A chat template for the random models (their tokenizer has none): ChatML, as SmolLM2's.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


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
    ap.add_argument("--old-ref", help="each server also as this git commit's runtime, alternating")
    args = ap.parse_args(argv)
    if args.model and args.shape:
        ap.error("--model or --shape, not both")
    import torch  # once parsed: gpu_check.sh's dry run stops at the parse (no torch, ~2 s)

    cuda = torch.cuda.is_available()
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
        trees = {"": None}
        if args.old_ref:  # before, then after, for every workload and round
            from long_context import _old_tree  # (torch: not for gpu_check.sh's dry run)

            trees = {f" ({args.old_ref})": str(_old_tree(args.old_ref, Path(tmp))), "": None}
        servers = start_servers(args.servers, common, args.ready_timeout, trees)
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
            for s in servers:  # nor its background start-up work (the grammar compiler)
                print(f"server {s.label!r}: idle {s.settle():.1f} s later")
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
