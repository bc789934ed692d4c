"""Tensor parallelism: one rank against N on the same model and requests, side by side.

A Llama of the chosen shape with random weights (`common.write_random_llama`, nothing is
downloaded) serves the same ragged batch of greedy requests on one rank and on N ranks
(`--tensor-parallel-size N`). Reported: output tok/s of each and their ratio, the KV-cache
capacity in tokens of each, and how many requests' greedy tokens agree. In float32 they must
all agree (the all-reduces only reorder sums of tiny differences); in bf16 a reordered sum can
flip a near-tie, so the script counts rather than asserts there.

On CUDA each rank takes one GPU (NCCL, the all-reduces inside the decode CUDA graphs): N must
not exceed the GPUs, and with one GPU there is no tensor-parallel speed to measure; the script
says so and stops. On the CPU the ranks share the cores (gloo): a correctness smoke run, whose
speed ratio says little (the same cores do all the work, plus the collectives).

    python -P benchmarks/tensor_parallel.py --shape 8b --tp 2            # a node with 2+ GPUs
    python -P benchmarks/tensor_parallel.py --tiny --dtype float32       # CPU smoke (seconds)
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, write_random_llama
from gpu_throughput import SHAPES
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.options import parse_size

TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip


def run(path: Path, tp: int, prompts: list[list[int]], args) -> dict:
    kw = dict(dtype=args.dtype, max_num_seqs=args.batch, tensor_parallel_size=tp)
    if args.kv_cache_memory:
        kw["kv_cache_memory"] = parse_size(args.kv_cache_memory)
    with LLM(str(path), **kw) as llm:
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
        llm.generate(prompts[:2], params)  # warm: first steps compile
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        took = time.perf_counter() - start
        capacity = llm.engine.kv.num_blocks * llm.engine.kv.block_size
    tokens = [o.outputs[0].token_ids for o in outs]
    return {"tok_s": sum(map(len, tokens)) / took, "tokens": tokens, "kv_tokens": capacity}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    p.add_argument("--tiny", action="store_true", help="a tiny model (CPU smoke run)")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kv-cache-memory", default=None, help="per rank, e.g. 64MiB (CPU)")
    args = p.parse_args(argv)
    print(machine())
    gpus = torch.cuda.device_count()
    if gpus == 1:
        print(f"one GPU: tensor-parallel speed needs {args.tp} GPUs; nothing measured")
        return 0
    if 1 < gpus < args.tp:
        print(f"--tp {args.tp} needs {args.tp} GPUs, this node has {gpus}")
        return 2
    if not gpus and args.kv_cache_memory is None:
        args.kv_cache_memory = "64MiB"
    cfg = TINY if args.tiny else SHAPES[args.shape]
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, cfg["vocab_size"], (args.prompt_len,), generator=g).tolist()
        for _ in range(args.requests)
    ]
    with tempfile.TemporaryDirectory() as d:
        dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
        write_random_llama(Path(d), cfg, dtype)
        one, many = run(Path(d), 1, prompts, args), run(Path(d), args.tp, prompts, args)
    same = sum(a == b for a, b in zip(one["tokens"], many["tokens"]))
    print(f"model {'tiny' if args.tiny else args.shape}, {args.dtype}, {args.requests} requests "
          f"of {args.prompt_len} + {args.output_len} tokens, batch {args.batch}")  # fmt: skip
    print(f"1 rank:  {one['tok_s']:9.1f} output tok/s, KV cache {one['kv_tokens']} tokens")
    print(f"{args.tp} ranks: {many['tok_s']:9.1f} output tok/s, KV cache {many['kv_tokens']} "
          f"tokens; {many['tok_s'] / one['tok_s']:.2f}x")  # fmt: skip
    print(f"greedy tokens equal on {same} of {len(prompts)} requests")
    return 0 if same == len(prompts) or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(main())
