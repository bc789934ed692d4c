"""Host overhead of one engine step: a 1-layer random model (vocab 32k) makes the forward nearly
free, so what remains is Python scheduling, input preparation, sampling, detokenization and
output building. Decode steps are timed at 32/128/256 running sequences, greedy and sampled
(temperature 0.6), with a per-phase breakdown.

    .venv/bin/python -P benchmarks/step_overhead.py                 # the table (~1 min)
    .venv/bin/python -P benchmarks/step_overhead.py --profile 256   # + cProfile of sampled steps
    .venv/bin/python -P benchmarks/step_overhead.py --seqs 256 --samplers native torch  # A/B
    .venv/bin/python -P benchmarks/step_overhead.py --old-ref REF   # before/after, alternating
    .venv/bin/python -P benchmarks/step_overhead.py --filters       # + top-p and top-k steps
    .venv/bin/python -P benchmarks/step_overhead.py --seqs 256 --decoded 500 --old-ref REF
        # before/after with 500 tokens already out per sequence (what grows with long outputs)

`--samplers native torch` times each case with the native C sampler kernels and with the PyTorch
sampler, alternating in one run (the kernels are `pagoda.runtime.sampling.native`). `--head on off`
does the same with and without the LM head's own sampling (`qgemm`'s sampling mode, float32
models on AVX2 CPUs: the tokens come out of the forward, no logits are written); the sampler
column says "+ LM head" where it ran. `--extras` adds steps whose rows ask penalties (presence
and frequency; repetition) or logprobs, which read every row's logits. `--filters` adds sampled
steps whose rows ask top-p 0.9
and top-k 40 (the random model's rows are flat: top-p's hardest case for the sampler).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import cProfile
import itertools
import json
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table, until_decoding, write_random_llama
from long_context import _old_tree
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

try:
    from pagoda.runtime.sampling import native as sampler_native
except ImportError:  # an --old-ref runtime from before the sampling package (early Dec 2026)
    from pagoda.runtime import sampler_native

TINY = dict(
    vocab_size=32000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)
PHASES = ("schedule", "prepare", "forward", "sample", "readback", "update", "detokenize", "outputs")


def running_engine(
    loaded, n: int, sampling: list[dict], prompt_len: int, steps: int, seed: int, decoded: int = 0
):
    """An engine with `n` sequences past their prefill, each decoding one token per step, with
    `decoded` tokens generated already (long outputs: what per-request state grows with);
    `sampling`: SamplingParams fields (temperature, filters), taken in turn by the requests."""
    budget = 2 * steps + 16 + decoded  # max_tokens
    llm = LLM(
        loaded=loaded,
        max_num_seqs=n,
        max_num_batched_tokens=max(2048, n * prompt_len),
        kv_cache_memory=max(256 << 20, n * (prompt_len + budget + 64) * 1024),
    )
    engine, rng = llm.engine, random.Random(seed)
    # room for the clocked and the wall-time runs of `steps` each (and the warm-up): no request
    # may finish while a run is timed
    params = [SamplingParams(**k, max_tokens=budget, ignore_eos=True) for k in sampling]
    for i in range(n):
        ids = [rng.randrange(3, TINY["vocab_size"]) for _ in range(prompt_len)]
        engine.add_request(f"r{i}", ids, params[i % len(params)])
    until_decoding(engine)
    for _ in range(3 + decoded):  # warm-up decode steps
        engine.step()
    return engine


def measure(
    loaded,
    n: int,
    sampling: list[dict],
    steps: int,
    prompt_len: int,
    head: bool = True,
    decoded: int = 0,
) -> dict:
    engine = running_engine(loaded, n, sampling, prompt_len, steps, seed=n, decoded=decoded)
    if not head:  # logits written and sampled after the forward, even where the head samples
        engine.runner.head_sampling = False
    assert engine.scheduler.num_running == n
    clock = engine.enable_step_clock()  # phases (marks cost ~1 µs each) ...
    for _ in range(steps):
        engine.step()
    engine.clock = engine.runner.clock = None  # ... then wall time without the clock
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = (time.perf_counter() - t) / steps
    assert engine.scheduler.num_running == n, "a request finished during the timed steps"
    fused = getattr(engine.runner, "head_sampling", False) and head_sampled(engine)
    return {"wall_ms": 1e3 * wall, "fused_head": fused, **clock.per_step_ms()}


def head_sampled(engine) -> bool:
    """Whether the LM head hands back a step's tokens (filters it cannot take, or none on this
    CPU, send them through the logits): one more step with the forward's `head` argument spied."""
    model, seen = engine.runner.model, []
    forward = model.forward

    def spy(*args, **kwargs):
        seen.append((args[-1] if args else kwargs.get("head")) is not None)
        return forward(*args, **kwargs)

    model.forward = spy
    try:
        engine.step()
    finally:
        del model.forward  # the class's method again
    return any(seen)


def use_sampler(kind: str) -> str:
    """Switch the CPU sampler between the native kernels and PyTorch; the kind actually used."""
    os.environ["PAGODA_NATIVE_SAMPLER"] = "1" if kind == "native" else "0"
    sampler_native._library.cache_clear()
    return "native" if sampler_native.available() else "torch"


def profile(loaded, n: int, steps: int, prompt_len: int) -> None:
    engine = running_engine(loaded, n, [{"temperature": 0.6}], prompt_len, steps, seed=n)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    print(f"\ncProfile, {steps} sampled steps at {n} sequences (tottime):")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


def measure_all(loaded, args) -> list[dict]:
    """Every (seqs, sampling, sampler) case: wall ms per step and the clocked phases."""
    rows = []
    for n in args.seqs:
        for name, sampling in cases(args.filters, args.extras, args.cases):
            for kind, head in itertools.product(args.samplers, args.head):
                used = use_sampler(kind)
                r = measure(
                    loaded, n, sampling, args.steps, args.prompt_len, head == "on", args.decoded
                )
                r["host_ms"] = sum(r.get(p, 0.0) for p in PHASES if p != "forward")
                used += " + LM head" if r["fused_head"] else ""
                rows.append({"seqs": n, "sampling": name, "sampler": used, **r})
                print(f"  {n} seqs {name} ({used}): {r['wall_ms']:.2f} ms/step", flush=True)
    use_sampler(args.samplers[0])
    return rows


def cases(
    filters: bool, extras: bool = False, base: tuple[str, ...] | list[str] = ("greedy", "sampled")
) -> list[tuple[str, list[dict]]]:
    """(name, SamplingParams fields the requests take in turn): greedy and sampled; with
    `filters` also top-p, top-k, and a batch whose rows alternate between plain and top-k;
    with `extras`, penalties and logprobs."""
    plain, top_k = {"temperature": 0.6}, {"temperature": 0.6, "top_k": 40}
    out = [("greedy", [{"temperature": 0.0}])] if "greedy" in base else []
    out += [("sampled T=0.6", [plain])] if "sampled" in base else []
    if filters:
        out += [
            ("T=0.6 top-p 0.9", [{"temperature": 0.6, "top_p": 0.9}]),
            ("T=0.6 top-k 40", [top_k]),
            ("half top-k 40", [plain, top_k]),
        ]
    if extras:
        out += [
            (
                "T=0.6 presence+frequency",
                [{**plain, "presence_penalty": 0.5, "frequency_penalty": 0.3}],
            ),
            ("T=0.6 repetition 1.1", [{**plain, "repetition_penalty": 1.1}]),
            ("T=0.6 logprobs 5", [{**plain, "logprobs": 5}]),
        ]
    return out


def before_after(args) -> None:
    """This tree and `--old-ref`'s runtime, each in a child process, alternating for `rounds`
    rounds (each round the other one first) so that drift on a shared machine hits both alike;
    medians of the rounds."""
    rounds = args.rounds
    cmd = [sys.executable, "-P", __file__, "--child", "--steps", str(args.steps)]
    cmd += ["--prompt-len", str(args.prompt_len), "--seqs", *map(str, args.seqs)]
    cmd += ["--decoded", str(args.decoded), "--cases", *args.cases]
    cmd += ["--filters"] if args.filters else []
    cmd += ["--extras"] if args.extras else []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": str(_old_tree(args.old_ref, Path(tmp))), "after": None}
        # one checkpoint for both trees, written here: the same weights, and no child imports
        # transformers to write its own (seconds of each child's start)
        (Path(tmp) / "model").mkdir()
        write_random_llama(Path(tmp) / "model", TINY)
        cmd += ["--model-dir", str(Path(tmp) / "model")]
        runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
        for r in range(rounds):  # who goes first alternates too: drift within a round
            for label, tree in list(trees.items())[:: 1 if r % 2 == 0 else -1]:
                env = dict(os.environ)
                if tree is not None:
                    env["PYTHONPATH"] = tree
                res = subprocess.run(cmd, env=env, capture_output=True, text=True)
                lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
                if res.returncode or not lines:
                    raise RuntimeError(f"{label} failed:\n{res.stderr[-3000:]}")
                result = json.loads(lines[-1][len("RESULT ") :])
                if tree is not None and not result["runtime"].startswith(tmp):
                    raise RuntimeError(f"the child imported {result['runtime']}, not {tree}")
                runs[label].append(result["rows"])
                print(f"  round done: {label}", flush=True)
    rows = []
    for i, case in enumerate(runs["after"][0]):
        med = {
            k: {f: statistics.median(r[i][f] for r in runs[k]) for f in ("host_ms", "wall_ms")}
            for k in runs
        }
        b, a = med["before"], med["after"]
        ratio = f"{b['host_ms'] / a['host_ms']:.2f}x"
        host = [f"{b['host_ms']:.2f}", f"{a['host_ms']:.2f}", ratio]
        rows.append(
            [case["seqs"], case["sampling"], *host, f"{b['wall_ms']:.2f}", f"{a['wall_ms']:.2f}"]
        )
    print(f"\nms per decode step, before = {args.old_ref}, after = this tree ({rounds} rounds):")
    heads = ["seqs", "sampling", "host before", "host after", "host ratio"]
    print(markdown_table([*heads, "step before", "step after"], rows))
    print("\nphases, median ms before / after:")
    print(markdown_table(["seqs", "sampling", *PHASES], phase_rows(runs)))


def phase_rows(runs: dict[str, list[list[dict]]]) -> list[list]:
    """Per case, each clocked phase as 'before / after' (medians over the rounds): where a
    host-time difference between the trees comes from."""
    rows = []
    for i, case in enumerate(runs["after"][0]):
        cells = []
        for p in PHASES:
            b, a = (statistics.median(r[i].get(p, 0.0) for r in runs[k]) for k in runs)
            cells.append(f"{b:.2f} / {a:.2f}")
        rows.append([case["seqs"], case["sampling"], *cells])
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument(
        "--decoded",
        type=int,
        default=0,
        help="tokens each sequence decodes before the timed steps (long outputs)",
    )
    ap.add_argument(
        "--cases",
        nargs="+",
        choices=["greedy", "sampled"],
        default=["greedy", "sampled"],
        help="which of the two base cases to time",
    )
    ap.add_argument("--profile", type=int, metavar="N", help="cProfile sampled steps at N seqs")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    ap.add_argument(
        "--samplers",
        nargs="+",
        choices=["native", "torch"],
        default=["native"],
        help="CPU sampler implementations to time side by side",
    )
    ap.add_argument(
        "--head",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="let the LM head sample where it can (qgemm), or not: side by side with both",
    )
    ap.add_argument("--filters", action="store_true", help="also time top-p, top-k and mixed steps")
    ap.add_argument("--extras", action="store_true", help="also time penalty and logprobs steps")
    ap.add_argument("--old-ref", help="also time the runtime of this git commit (before/after)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="with --old-ref: rounds of before and after, alternating (medians)")  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {machine()}")
    if args.old_ref:
        before_after(args)
        return
    if args.model_dir:  # (a before/after child: the parent wrote it)
        loaded = load_model(args.model_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            write_random_llama(Path(tmp), TINY)
            loaded = load_model(tmp)
    rows = measure_all(loaded, args)
    if args.child:
        import pagoda.runtime

        print("RESULT " + json.dumps({"runtime": pagoda.runtime.__file__, "rows": rows}))
        return
    table = [
        [r["seqs"], r["sampling"], r["sampler"], f"{r['wall_ms']:.2f}", f"{r['host_ms']:.2f}"]
        + [f"{r.get(p, 0.0):.2f}" for p in PHASES]
        for r in rows
    ]
    print(f"\nms per decode step (dtype {loaded_dtype()}, vocab {TINY['vocab_size']}, 1 layer):")
    print(
        "(step: wall time of a run without the clock; host: the clocked run's phases but forward)"
    )
    print(markdown_table(["seqs", "sampling", "sampler", "step", "host", *PHASES], table))
    if any(r.get("fused_head") for r in rows):
        print(
            "(the LM head hands back the tokens itself (qgemm's sampling mode), so their cost "
            "is in forward, and no logits are written)"
        )
    if args.profile:
        profile(loaded, args.profile, args.steps, args.prompt_len)


def loaded_dtype() -> str:
    from pagoda.runtime.config import EngineConfig

    return str(EngineConfig().torch_dtype()).replace("torch.", "")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
