"""Embeddings throughput: Pagoda's pooling runner vs transformers' batched forward, one process.

The embedded SmolLM2-135M served as a LAST-pooling embedding model (`runner="pooling"`, the
last prompt token's final-norm hidden state, normalized): a ragged batch of prompts (default 32,
16-256 tokens) through `LLM.embed` and through transformers' `model.model` in left-padded,
length-sorted batches (its best case), the same dtype, alternating, best of `--repeats`. Reported: embeddings/s and
prompt tokens/s of each, Pagoda's ratio, and the largest difference between the two systems'
vectors (a cross-check: they are the same function).

    .venv/bin/python -P benchmarks/embed_throughput.py [--prompts 32] [--max-len 256] [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as offline_throughput.py (docs/benchmarks.md)

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table, ragged_workload
from pagoda.runtime import LLM
from pagoda.runtime.config import cpu_has_fast_bf16
from pagoda.runtime.model.loader import load_model


def pagoda_runner(loaded, prompts, dtype: str):
    """A call that embeds `prompts` once with Pagoda: (seconds, vectors)."""
    llm = LLM(loaded=loaded, runner="pooling", dtype=dtype, max_num_seqs=64,
              max_num_batched_tokens=2048)  # fmt: skip
    llm.embed([prompts[0][:16]], use_tqdm=False)  # warm-up

    def run() -> tuple[float, np.ndarray]:
        t = time.perf_counter()
        outs = llm.embed(prompts, use_tqdm=False)
        dt = time.perf_counter() - t
        return dt, np.array([o.outputs.embedding for o in outs], dtype=np.float32)

    return run


def hf_runner(path: str, prompts, dtype: torch.dtype, batch: int, pad_id: int):
    """A call that embeds `prompts` once with transformers: (seconds, vectors)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype
    ).eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # HF's best case

    def run() -> tuple[float, np.ndarray]:
        out = np.zeros((len(prompts), model.config.hidden_size), dtype=np.float32)
        t = time.perf_counter()
        for s in range(0, len(order), batch):
            rows = order[s : s + batch]
            group = [prompts[i] for i in rows]
            width = max(map(len, group))
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            positions = (mask.cumsum(1) - 1).clamp(min=0)
            with torch.no_grad():
                h = model.model(input_ids=ids, attention_mask=mask, position_ids=positions)
            v = torch.nn.functional.normalize(h.last_hidden_state[:, -1].float(), dim=-1)
            out[rows] = v.numpy()
        return time.perf_counter() - t, out

    run()  # warm-up
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--hf-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="default: bfloat16 on CPUs with native bf16, else float32")  # fmt: skip
    args = p.parse_args()
    dtype = args.dtype or ("bfloat16" if cpu_has_fast_bf16() else "float32")
    loaded = load_model("smollm2-135m")
    prompts = ragged_workload(loaded.tokenizer, args.prompts, args.min_len, args.max_len)
    tokens = sum(map(len, prompts))
    print(machine())
    print(f"load average {os.getloadavg()[0]:.1f}; {len(prompts)} prompts, {tokens} tokens "
          f"({args.min_len}-{args.max_len}); {dtype}")  # fmt: skip
    pagoda = pagoda_runner(loaded, prompts, dtype)
    pad = loaded.tokenizer.eos_token_ids[0] if loaded.tokenizer.eos_token_ids else 0
    hf = hf_runner(loaded.path, prompts, getattr(torch, dtype), args.hf_batch, pad)
    pt = ht = float("inf")
    for _ in range(args.repeats):  # alternating, best of each (the machine is shared)
        t, pv = pagoda()
        pt = min(pt, t)
        t, hv = hf()
        ht = min(ht, t)
    rows = [
        ["pagoda LLM.embed (LAST)", f"{len(prompts) / pt:.1f}", f"{tokens / pt:.0f}", f"{pt:.2f}"],
        [f"transformers model.model, batch {args.hf_batch}", f"{len(prompts) / ht:.1f}",
         f"{tokens / ht:.0f}", f"{ht:.2f}"],
    ]  # fmt: skip
    print(markdown_table(["system", "embeddings/s", "prompt tokens/s", "seconds"], rows))
    print(f"pagoda / transformers: {ht / pt:.2f}x; max |difference| of the vectors "
          f"{np.abs(pv - hv).max():.2e}; load average after {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
