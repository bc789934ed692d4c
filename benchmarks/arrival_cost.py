"""Engine-loop cost of one arrival: what the engine process spends on a new request between
steps (`EngineCoreProc.apply` of the API process's pickled `add` command: unpickling, then
`EngineCore.add_request`), for a burst of N requests on the 1-layer random model of
`step_overhead.py`. Each burst is aborted before the next; the figure is the best of the
rounds, wall and process CPU per arrival.

    .venv/bin/python -P benchmarks/arrival_cost.py                        # 256 arrivals, 64 and 562 tokens
    .venv/bin/python -P benchmarks/arrival_cost.py --old-ref REF --rounds 2   # before/after, alternating

562 tokens is the mean prompt of nano-vllm's workload (`gpu_serving.py` on a GPU); every burst
holds the same SamplingParams (temperature 0.6, `ignore_eos`), validated in the API process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import json
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table


class _Outbox:
    def send_multipart(self, parts) -> None:  # a refused request: never expected here
        raise RuntimeError(f"the engine refused a request: {parts!r}")


def measure(n: int, prompt_lens: list[int], bursts: int) -> list[dict]:
    """Best (wall, CPU) µs per arrival over `bursts` bursts of `n`, per prompt length."""
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.engine.core_proc import EngineCoreProc
    from pagoda.runtime.model.loader import load_model
    from step_overhead import TINY, write_random_llama

    with tempfile.TemporaryDirectory() as tmp:
        write_random_llama(Path(tmp), TINY)
        loaded = load_model(tmp)
    longest = max(prompt_lens)
    llm = LLM(loaded=loaded, max_num_seqs=n, max_num_batched_tokens=4096,
              kv_cache_memory=256 << 20, max_model_len=longest + 128)  # fmt: skip
    core, proc = llm.engine, EngineCoreProc(None, _Outbox(), os.getppid())
    params = SamplingParams(temperature=0.6, max_tokens=100, ignore_eos=True).validated()
    rng, rows = random.Random(0), []
    for plen in prompt_lens:
        prompts = [[rng.randrange(3, TINY["vocab_size"]) for _ in range(plen)] for _ in range(n)]
        wall, cpu = [], []
        for b in range(bursts):
            rids = [f"b{plen}-{b}-{i}" for i in range(n)]
            msgs = [pickle.dumps([("add", r, ids, params)], protocol=5)
                    for r, ids in zip(rids, prompts)]  # fmt: skip
            t, c = time.perf_counter(), time.process_time()
            for m in msgs:
                for cmd in pickle.loads(m):
                    proc.apply(core, cmd)
            wall.append((time.perf_counter() - t) / n * 1e6)
            cpu.append((time.process_time() - c) / n * 1e6)
            for r in rids:
                core.abort_request(r)
        rows.append({"prompt_len": plen, "wall_us": min(wall), "cpu_us": min(cpu)})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrivals", type=int, default=256, help="requests per burst")
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[64, 562])
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--old-ref", help="also time the runtime of this git commit, alternating")
    ap.add_argument("--rounds", type=int, default=2, help="with --old-ref: rounds per tree")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure(args.arrivals, args.prompt_lens, args.bursts)))
        return
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the start")
    from long_context import _old_tree

    cmd = [sys.executable, "-P", __file__, "--child", "--arrivals", str(args.arrivals),
           "--bursts", str(args.bursts), "--prompt-lens", *map(str, args.prompt_lens)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": None}
        if args.old_ref:
            trees = {args.old_ref: str(_old_tree(args.old_ref, Path(tmp))), "this tree": None}
        runs: dict[str, list[list[dict]]] = {k: [] for k in trees}
        for _ in range(args.rounds if args.old_ref else 1):
            for label, tree in trees.items():
                env = dict(os.environ, **({"PYTHONPATH": tree} if tree else {}))
                res = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
                if res.returncode or not lines:
                    raise RuntimeError(f"{label} failed:\n{res.stderr[-3000:]}")
                runs[label].append(json.loads(lines[-1][len("RESULT ") :]))
    rows = []
    for i, plen in enumerate(args.prompt_lens):
        cells = []
        for label in trees:
            wall = statistics.median(r[i]["wall_us"] for r in runs[label])
            cpu = statistics.median(r[i]["cpu_us"] for r in runs[label])
            cells.append(f"{wall:.1f} / {cpu:.1f}")
        rows.append([plen, *cells])
    print(f"\nµs per arrival, wall / CPU ({args.arrivals} per burst, best of {args.bursts} bursts"
          f"{', medians of the rounds' if args.old_ref else ''}):")  # fmt: skip
    print(markdown_table(["prompt tokens", *trees], rows))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
