"""The int8 KV cache against the model's dtype: accuracy, capacity and decode speed, side by side.

On the embedded model (bf16 weights), in one run:

- **accuracy**: next-token distributions over real English text (the docstrings of a few
  standard-library modules, teacher-forced in one prefill so every row reads the cache) against a
  float32 reference: mean and p99 KL divergence, top-1 agreement, perplexity;
- **capacity**: tokens the default 2 GiB KV budget holds;
- **prefill**: seconds to prefill a few long random prompts (time to first token's main part);
- **decode speed**: steps of two engines (``auto`` and ``int8``) with the same sequences past
  their prefill, alternating in blocks (``decode_ab.compare``), at several batch sizes and context
  lengths::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/kv_cache_dtype.py [--cases 32x512 8x2000 1x5000]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import kv_bytes_per_token, machine, markdown_table
from decode_ab import compare, engine
from pagoda.runtime import LLM
from pagoda.runtime.config import cpu_has_fast_bf16
from pagoda.runtime.worker.cache_budget import CPU_DEFAULT_KV_BYTES

KINDS = ("auto", "int8")


def text_ids(tokenizer, n: int) -> list[int]:
    """`n` tokens of English prose that ships with Python (module docstrings)."""
    import argparse as a
    import collections
    import json
    import logging
    import subprocess
    import textwrap
    import unittest

    modules = (a, json, logging, subprocess, unittest, collections, textwrap)
    ids = tokenizer.encode("\n\n".join(m.__doc__ or "" for m in modules))
    if len(ids) < n:
        raise ValueError(f"only {len(ids)} tokens of text, asked for {n}")
    return ids[:n]


def forced_logits(loaded, ids: list[int], **engine_args) -> torch.Tensor:
    """float32 logits of every position of `ids`, prefilled as one chunk."""
    from pagoda.runtime.attention.base import AttentionMetadata

    llm = LLM(loaded=loaded, max_model_len=len(ids) + 16, kv_cache_memory=64 << 20, **engine_args)
    r, n = llm.engine.runner, len(ids)
    meta = AttentionMetadata(
        num_seqs=1, num_decodes=0, num_tokens=n, max_query_len=n, max_seq_len=n,
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(-(-n // r.block_size), dtype=torch.int32)[None],
        slot_mapping=torch.arange(n), block_size=r.block_size,
        query_lens_host=[n], seq_lens_host=[n],
    )  # fmt: skip
    r.backend.prepare(meta)
    pos = torch.arange(n)
    return r.model.forward(torch.tensor(ids), pos, r.kv_caches, meta, pos).float()


def accuracy(loaded, tokens: int) -> list[list[object]]:
    ids = text_ids(loaded.tokenizer, tokens)
    ref = torch.log_softmax(forced_logits(loaded, ids, dtype="float32"), -1)
    nxt = torch.tensor(ids[1:])[:, None]
    rows = [["float32 reference", "0", "0", "1.0000", f"{_ppl(ref, nxt):.3f}"]]
    model = "bf16" if cpu_has_fast_bf16() else "float32"  # what dtype auto runs on this CPU
    for kind in KINDS:
        got = torch.log_softmax(forced_logits(loaded, ids, kv_cache_dtype=kind), -1)
        kl = (ref.exp() * (ref - got)).sum(-1)
        top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean()
        name = f"{model} model, {model if kind == 'auto' else 'int8'} cache"
        rows.append([name, f"{kl.mean():.5f}", f"{kl.quantile(0.99):.4f}", f"{top1:.4f}",
                     f"{_ppl(got, nxt):.3f}"])  # fmt: skip
    return rows


def _ppl(logp: torch.Tensor, nxt: torch.Tensor) -> float:
    return float((-logp[:-1].gather(1, nxt).mean()).exp())


def capacity(loaded) -> list[list[object]]:
    rows = []
    for kind in KINDS:
        llm = LLM(loaded=loaded, kv_cache_dtype=kind, max_model_len=2048)
        r = llm.engine.runner
        per_token = r.bytes_per_block // r.block_size
        rows.append([kind, per_token, f"{r.num_blocks * r.block_size:,}"])
        del llm
    return rows


def speed(loaded, cases: list[str], block_steps: int, blocks: int) -> list[list[object]]:
    rows, steps = [], block_steps * blocks + 4
    for case in cases:
        n, context = (int(x) for x in case.split("x"))
        engines = {
            "before": engine(loaded, n, context, steps, seed=n, kv_cache_dtype="auto"),
            "after": engine(loaded, n, context, steps, seed=n, kv_cache_dtype="int8"),
        }
        auto_ms, int8_ms = compare(engines, block_steps, blocks)
        rows.append([n, context, f"{auto_ms:.2f}", f"{int8_ms:.2f}", f"{n / auto_ms * 1e3:.1f}",
                     f"{n / int8_ms * 1e3:.1f}", f"{auto_ms / int8_ms:.2f}x"])  # fmt: skip
        del engines
    return rows


def prefill(loaded, case: str, rounds: int = 3) -> list[list[object]]:
    """Seconds to prefill SEQSxTOKENS random prompts (one output token), engines alternating."""
    import random
    import time

    from pagoda.runtime import SamplingParams

    n, tokens = (int(x) for x in case.split("x"))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 40000) for _ in range(tokens)] for _ in range(n)]
    once = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    budget = (n + 1) * (tokens + 32) * kv_bytes_per_token(loaded.config)
    llms = {
        kind: LLM(loaded=loaded, kv_cache_dtype=kind, max_model_len=tokens + 16,
                  enable_prefix_caching=False, kv_cache_memory=budget)
        for kind in KINDS
    }  # fmt: skip
    best = dict.fromkeys(KINDS, float("inf"))
    for _ in range(rounds):
        for kind, llm in llms.items():
            t = time.perf_counter()
            llm.generate(prompts, once)
            best[kind] = min(best[kind], time.perf_counter() - t)
    ratio = best["auto"] / best["int8"]
    return [[n, tokens, f"{best['auto']:.2f}", f"{best['int8']:.2f}", f"{ratio:.2f}x"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["32x512", "8x2000", "1x5000"],
                    help="SEQSxCONTEXT: running sequences and their prompt length")  # fmt: skip
    ap.add_argument("--text-tokens", type=int, default=1000)
    ap.add_argument("--prefill", default="4x2000", help="SEQSxTOKENS prompts to prefill")
    ap.add_argument("--block-steps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=8, help="blocks per engine")
    args = ap.parse_args(argv)
    print(machine())
    from pagoda.runtime.model.loader import load_model

    loaded = load_model("smollm2-135m")
    print(f"\nAccuracy, {args.text_tokens} tokens of text, against float32:\n")
    heads = ["configuration", "mean KL", "p99 KL", "top-1 agreement", "perplexity"]
    print(markdown_table(heads, accuracy(loaded, args.text_tokens)))
    print(f"\nCapacity of the default {CPU_DEFAULT_KV_BYTES >> 30} GiB budget:\n")
    print(markdown_table(["kv_cache_dtype", "bytes per token", "tokens"], capacity(loaded)))
    print("\nPrefill (best of 3, engines alternating; prefix caching off):\n")
    heads = ["seqs", "tokens", "s auto", "s int8", "int8 vs auto"]
    print(markdown_table(heads, prefill(loaded, args.prefill)))
    print("\nDecode steps (medians, engines alternating):\n")
    heads = [
        "seqs",
        "context",
        "ms/step auto",
        "ms/step int8",
        "tok/s auto",
        "tok/s int8",
        "int8 vs auto",
    ]
    print(markdown_table(heads, speed(loaded, args.cases, args.block_steps, args.blocks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
