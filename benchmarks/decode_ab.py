"""Decode steps of the embedded model with this tree's CPU kernels against a git revision's.

Two engines in one process on the same weights, each with `n` sequences past their prefill
(random prompts of ``--context`` tokens, greedy, ``ignore_eos``); the second one's CPU GEMV
layers and/or paged-attention kernel are rebound to the kernels built from revision
``--old-ref``. Steps alternate between the engines in blocks of ``--block-steps`` (the machine
is shared: alternation keeps load changes from favouring one side), the median step of each is
compared, and both engines' tokens are compared at the end (equal when the kernels' bits are).
What a kernel A/B (``cpu_gemv.py``, ``cpu_attention.py``) measures alone, at engine level::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/decode_ab.py --old-ref fc117ed --seqs 8 24 32

The GEMV takes every bf16 matmul only on CPUs without AMX; on an AMX machine it takes steps of
up to 4 rows, unless oneDNN is kept off AMX (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
PAGODA_CPU_AMX_GEMM=0``, the non-AMX path emulated).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_attention
import cpu_gemv
from common import kv_bytes_per_token, machine, markdown_table, until_decoding
from long_context import library_at
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.cpu import gemv
from pagoda.runtime.model.linear import _pack

PARTS = ("gemv", "attention")


def engine(loaded, n: int, context: int, steps: int, seed: int, **engine_args):
    """An engine with `n` sequences past their prefill, room for `steps` more tokens each
    (`engine_args`: more `LLM` arguments, e.g. ``kv_cache_dtype``)."""
    per_seq = context + steps + 32  # tokens a sequence may hold
    llm = LLM(
        loaded=loaded,
        max_num_seqs=n,
        max_model_len=per_seq,
        kv_cache_memory=n * (per_seq + 32) * kv_bytes_per_token(loaded.config),
        **engine_args,
    )
    eng, rng = llm.engine, random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(n):
        eng.add_request(f"r{i}", [rng.randrange(3, 40000) for _ in range(context)], params)
    until_decoding(eng)
    return eng


def rebind(eng, old: dict) -> list[str]:
    """Point `eng`'s kernels at the old builds; returns what was rebound."""
    done = []
    if "gemv" in old:
        layers = [x for x in eng.runner.model.linears() if isinstance(x.fast, gemv.GemvWeight)]
        for lin in layers:
            lin.fast = old["gemv"].bind(lin.packed, lin.bias)
        if layers:
            done.append(f"gemv ({len(layers)} layers)")
    backend = eng.runner.backend
    if "attention" in old and getattr(backend, "kernel", None) is not None:
        backend.kernel = old["attention"]
        done.append("attention")
    return done


def compare(engines: dict, block_steps: int, blocks: int) -> tuple[float, float]:
    """Median ms per step of the 'before' and 'after' engines, alternating blocks of steps."""
    times: dict[str, list[float]] = {k: [] for k in engines}
    for b in range(blocks):
        for name in sorted(engines, reverse=b % 2 == 1):
            eng = engines[name]
            for _ in range(block_steps):
                t = time.perf_counter()
                eng.step()
                times[name].append(time.perf_counter() - t)
    return statistics.median(times["before"]) * 1e3, statistics.median(times["after"]) * 1e3


def tokens(eng) -> list[list[int]]:
    return [
        list(r.output_token_ids) for r in sorted(eng.scheduler.running, key=lambda r: r.request_id)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", default="HEAD", help="git revision whose kernels are 'before'")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--seqs", type=int, nargs="+", default=[8, 24, 32, 48])
    ap.add_argument("--context", type=int, default=300, help="prompt tokens per sequence")
    ap.add_argument("--block-steps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=16, help="blocks per engine")
    args = ap.parse_args(argv)
    print(machine())
    from pagoda.runtime.model.loader import load_model

    loaded = load_model("smollm2-135m")
    old = {}
    if "gemv" in args.parts and gemv.load(_pack) is not None:
        old["gemv"] = cpu_gemv.kernel(library_at(args.old_ref, cpu_gemv.BUILD))
    if "attention" in args.parts:
        old["attention"] = cpu_attention.old_kernel(args.old_ref)
    steps = args.block_steps * args.blocks + 4
    rows = []
    for n in args.seqs:
        engines = {k: engine(loaded, n, args.context, steps, seed=n) for k in ("before", "after")}
        swapped = ", ".join(rebind(engines["before"], old)) or "none (nothing to swap here)"
        before, after = compare(engines, args.block_steps, args.blocks)
        same = tokens(engines["before"]) == tokens(engines["after"])
        rows.append([n, swapped, f"{before:.2f}", f"{after:.2f}", f"{before / after:.2f}x", same])
    heads = ["seqs", f"{args.old_ref}'s kernels in 'before'", "ms/step before", "ms/step after"]
    heads += ["ratio", "same tokens"]
    print(markdown_table(heads, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
