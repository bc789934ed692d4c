"""Prefill and decode speed of the recurrent families without attention kernels of their own
(Mamba-1's selective scan, position by position in a prefill chunk; pure Mamba2's chunked SSD
scan; LFM2's short convs; Jamba's Mamba-1 layers beside attention and experts; Zamba2's Mamba2
layers and shared blocks) next to Llama of the same width and depth, in one run on this machine.

Tiny random models written by transformers (hidden 256, 4 layers; Mamba-1 d_inner 512 and
d_state 16; Mamba2 8 heads of 64, d_state 16; LFM2 three conv layers and one attention layer;
Jamba three Mamba-1 layers and one attention layer, 4 experts top 2 on two; Zamba2 four Mamba2
layers, two of them after a use of one shared block with rank-16 adapters).
Prefill tokens/s: `--seqs` prompts of `--prompt` tokens from their first token until every one
is computed (steps of `--max-num-batched-tokens`); decode tokens/s as
`hybrid_decode.decode_rate`. Prefix caching is off for all (the repeated prompts would be
cache hits; `hybrid_prefix.py` measures it). The models alternate `--repeats` times, each one's best kept.

    .venv/bin/python -P benchmarks/recurrent_families.py [--prompt 512] [--seqs 1 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from common import machine, markdown_table
from hf_oracle import make_tiny_model
from hybrid_decode import decode_rate
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

SHAPE = dict(vocab_size=1000, hidden_size=256, num_hidden_layers=4, max_position_embeddings=2048)
MODELS = {
    "llama (4 attention)": ("Llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=512)),
    "mamba-1 (4 layers)": ("Mamba", dict(state_size=16)),
    "mamba2 (4 layers)": ("Mamba2", dict(num_heads=8, head_dim=64, state_size=16, n_groups=1,
                                         chunk_size=64)),
    "lfm2 (3 conv + 1 attention)": ("Lfm2", dict(
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
        layer_types=["conv", "conv", "full_attention", "conv"])),
    "jamba (3 mamba-1 + 1 attention, 2 MoE)": ("Jamba", dict(
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=512, attn_layer_period=4,
        attn_layer_offset=2, expert_layer_period=2, expert_layer_offset=1, num_experts=4,
        mamba_d_state=16)),
    "zamba2 (4 mamba2, 2 block uses)": ("Zamba2", dict(
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_attention_heads=4,
        num_key_value_heads=4, n_mamba_heads=8, mamba_d_state=16, chunk_size=64,
        intermediate_size=512, adapter_rank=16, use_shared_attention_adapter=True)),
}  # fmt: skip


def prefill_rate(llm: LLM, seqs: int, prompt: int) -> float:
    """Prompt tokens/s: `seqs` prompts from their first token until all are computed."""
    core = llm.engine
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    tag = time.monotonic_ns()
    t = time.perf_counter()
    for b in range(seqs):
        core.add_request(f"{tag}-{b}", [(7 * i + 3 * b) % 990 + 5 for i in range(prompt)], params)
    while core.has_unfinished_requests():
        core.step()
    return seqs * prompt / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(machine(), f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    width = max(*args.seqs, *args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for name, (arch, extra) in MODELS.items():
            path = Path(tmp) / arch
            path.mkdir()
            make_tiny_model(path, arch, **SHAPE, **extra)
            engines[name] = LLM(loaded=load_model(str(path)), dtype="float32",
                                max_num_seqs=width, enable_prefix_caching=False,
                                max_num_batched_tokens=args.max_num_batched_tokens)  # fmt: skip
        best: dict[tuple[str, str], float] = {}
        runs = [("prefill", s) for s in args.seqs] + [("decode", b) for b in args.batches]
        for _ in range(args.repeats):  # alternating the models
            for kind, n in runs:
                for name, llm in engines.items():
                    if kind == "prefill":
                        rate = prefill_rate(llm, n, args.prompt)
                    else:
                        rate = decode_rate(llm, n, 32, 64)
                    key = (name, f"{kind} x{n}")
                    best[key] = max(best.get(key, 0.0), rate)
    base = next(iter(MODELS))
    rows = [[name, what, f"{rate:.0f}", f"{rate / best[(base, what)]:.2f}"]
            for (name, what), rate in best.items()]  # fmt: skip
    print(markdown_table(["model", "run", "tok/s", "vs llama"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
