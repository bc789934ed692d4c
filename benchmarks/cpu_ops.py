"""Native vs torch CPU elementwise ops (`runtime/cpu/ops.py` vs `runtime/model/ops.py`), per call.

SmolLM2-135M shapes by default (hidden 576, intermediate 1536, 9 heads / 3 KV heads, head_dim
64), at T = 1 (a decode step of one sequence) and T = 2048 (a prefill chunk). Each op's two
versions are timed alternating call by call (the machine is shared: alternation keeps load
changes from favouring one side): at T <= 64 in blocks of 100 calls (warm caches, the
dispatch cost), above one call per block; medians in microseconds are printed.

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/cpu_ops.py --dtype bfloat16
    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/cpu_ops.py --decode   # whole-model A/B

`--decode` times greedy single-sequence generation (32-token prompt, 65 tokens) of a random
SmolLM2-135M-shaped model with the torch ops and with the native ops (forced through the model
runner's `select_ops`), alternating, and checks that both give the same tokens.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table, write_random_llama
from pagoda.runtime.cpu import ops as cpu_ops
from pagoda.runtime.model import ops


def cases(t: int, dtype: torch.dtype, hidden: int, inter: int, h: int, hk: int, d: int):
    """(name, setup) pairs; setup() returns fresh keyword arguments for one call."""
    x = torch.randn(t, hidden).to(dtype)
    res = torch.randn(t, hidden).to(dtype)
    w = torch.randn(hidden).to(dtype)
    gate_up = torch.randn(t, 2 * inter).to(dtype)
    qkv = torch.randn(t, (h + 2 * hk) * d).to(dtype)
    angle = torch.rand(t, d // 2) * 6.28
    cs = torch.cat([angle.cos(), angle.sin()], dim=-1).to(dtype)

    def rope_args():  # q and k as the model makes them; fresh copies: the ops work in place
        q, k, _ = qkv.clone().split([h * d, hk * d, hk * d], dim=-1)
        return {"positions": None, "q": q.reshape(t, h, d), "k": k.reshape(t, hk, d),
                "cos_sin_cache": cs}  # fmt: skip

    return [
        ("rms_norm", lambda: {"x": x, "weight": w, "eps": 1e-5}),
        ("rms_norm+residual", lambda: {"x": x, "weight": w, "eps": 1e-5, "residual": res.clone()}),
        ("rotary_embedding", rope_args),
        ("silu_and_mul", lambda: {"x": gate_up.clone()}),
    ]


def time_pair(fa: Callable, fb: Callable, setup: Callable, calls: int, blocks: int):
    """Median seconds per call of fa and fb: blocks of `calls` calls each, alternating A and B
    block by block (inputs are made before a block starts, outside the timing)."""
    ta, tb = [], []
    for _ in range(blocks):
        for fn, out in ((fa, ta), (fb, tb)):
            kwargs = [setup() for _ in range(calls)]
            start = time.perf_counter()
            for kw in kwargs:
                fn(**kw)
            out.append((time.perf_counter() - start) / calls)
    return float(np.median(ta)), float(np.median(tb))


SMOL = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
    tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
)  # fmt: skip


def decode_ab(dtype: str, reps: int = 6) -> None:
    """Per-token time of single-stream greedy decoding, torch ops vs native ops."""
    import tempfile

    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.worker import model_build

    with tempfile.TemporaryDirectory() as tmp:
        write_random_llama(Path(tmp), SMOL)
        llms, original = {}, model_build.select_ops
        try:
            for name, chosen in (
                ("torch", ops.TORCH_OPS),
                ("native", cpu_ops.cpu_ops(ops.TORCH_OPS)),
            ):
                model_build.select_ops = lambda device, backend, c=chosen: c
                llms[name] = LLM(loaded=load_model(tmp), dtype=dtype, kv_cache_memory=256 << 20)
        finally:
            model_build.select_ops = original
        prompt = [{"prompt_token_ids": [(7 * i + 3) % SMOL["vocab_size"] for i in range(32)]}]
        params = SamplingParams(temperature=0, max_tokens=65, ignore_eos=True)
        times, tokens = {name: [] for name in llms}, {}
        for _ in range(reps):
            for name, llm in llms.items():
                start = time.perf_counter()
                tokens[name] = llm.generate(prompt, params)[0].outputs[0].token_ids
                times[name].append((time.perf_counter() - start) / 65)
    print(f"same tokens: {tokens['torch'] == tokens['native']}")
    rows = [[name, f"{np.median(ts[1:]) * 1e3:.2f}"] for name, ts in times.items()]
    print(markdown_table(["ops", f"ms per token ({dtype}, median)"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2048])
    ap.add_argument("--blocks", type=int, default=0, help="default: 40 at T<=64, else 30")
    ap.add_argument("--decode", action="store_true", help="whole-model decode A/B instead")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    got = cpu_ops.cpu_ops(ops.TORCH_OPS)
    if got is None:
        sys.exit("native CPU ops unavailable (no compiler, or PAGODA_CPU_OPS=torch)")
    print(machine())
    if args.decode:
        return decode_ab(args.dtype)
    enabled = sorted(op for op, dt in cpu_ops._native_ops(ops.TORCH_OPS).enabled if dt == dtype)
    print(f"native for {args.dtype}: {', '.join(enabled)}")
    rows = []
    for t in args.rows:
        calls = 100 if t <= 64 else 1  # per timed block
        blocks = args.blocks or (40 if t <= 64 else 30)
        for name, setup in cases(t, dtype, 576, 1536, 9, 3, 64):
            op = name.split("+")[0]
            native, torch_fn = getattr(got, op), getattr(ops, op)
            tn, tt = time_pair(native, torch_fn, setup, calls, blocks)
            rows.append([t, name, f"{tt * 1e6:.1f}", f"{tn * 1e6:.1f}", f"{tt / tn:.2f}x"])
    print(markdown_table(["T", "op", "torch us", "native us", "speed-up"], rows))


if __name__ == "__main__":
    main()
