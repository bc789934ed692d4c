"""Decode speed of a hybrid model (Granite 4.0: Mamba2 + attention layers) on this machine, next
to an all-attention Granite of the same width and depth, at batch 1 and 32, in one run.

The hybrid runs twice: with the native CPU recurrence (`cpu/mamba_step.py`, the default for
float32 states) and with the torch one. Both tiny models are written by transformers with random weights (hidden 256, 4 layers: the
hybrid's three Mamba2 layers and one attention layer; 8 Mamba heads of 64, d_state 64). Decode
tokens/s: the batch's prompts are prefilled first, then the engine's steps are timed until
every request has its N tokens; the two models alternate `--repeats` times, each one's best
kept.

    .venv/bin/python -P benchmarks/hybrid_decode.py [--dtype float32] [--repeats 3]
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
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

SHAPE = dict(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip
HYBRID = dict(layer_types=["mamba", "mamba", "attention", "mamba"], mamba_n_heads=8,
              mamba_d_head=64, mamba_d_state=64, num_local_experts=0,
              shared_intermediate_size=512)  # fmt: skip


def build(root: Path) -> dict[str, object]:
    hybrid, dense = root / "granite4", root / "granite"
    for path in (hybrid, dense):
        path.mkdir()
    make_tiny_model(hybrid, "GraniteMoeHybrid", **SHAPE, **HYBRID)
    make_tiny_model(dense, "Granite", **SHAPE, intermediate_size=512)
    return {"granite 4.0 (3 Mamba2 + 1 attention)": load_model(str(hybrid)),
            "granite (4 attention)": load_model(str(dense))}  # fmt: skip


def decode_rate(llm: LLM, batch: int, prompt: int, new: int) -> float:
    """Output tokens/s of the decode steps alone: the batch's prompts prefilled first (not
    timed), then every step until the requests finish."""
    core = llm.engine
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    tag = time.monotonic_ns()
    for b in range(batch):
        ids = [(7 * i + 3 * b) % 990 + 5 for i in range(prompt)]
        core.add_request(f"{tag}-{b}", ids, params)
    sched = core.scheduler
    while len(sched.running) < batch or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in sched.running
    ):
        core.step()
    reqs = list(sched.running)
    done = sum(len(r.token_ids) - r.num_prompt_tokens for r in reqs)
    t = time.perf_counter()
    while core.has_unfinished_requests():
        core.step()
    return (batch * new - done) / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(machine(), f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        models = build(Path(tmp))
        engines = {name: LLM(loaded=m, dtype=args.dtype, max_num_seqs=max(args.batches),
                             max_num_batched_tokens=2048) for name, m in models.items()}  # fmt: skip
        # the hybrid again with the decode recurrence in torch (`model/mamba2.recurrent_step`)
        # instead of the native loop (`cpu/mamba_step.py`, float32 states on the CPU)
        hybrid = next(iter(models.values()))
        torch_path = LLM(loaded=hybrid, dtype=args.dtype, max_num_seqs=max(args.batches),
                         max_num_batched_tokens=2048)  # fmt: skip
        for layer in torch_path.engine.runner.model.layers:
            if layer.mixer is not None:
                layer.mixer.native = None
        engines["granite 4.0, torch recurrence"] = torch_path
        rows = []
        for b in args.batches:
            best: dict[str, float] = {}
            for _ in range(args.repeats):  # alternating the models
                for name, llm in engines.items():
                    rate = decode_rate(llm, b, args.prompt, args.new)
                    best[name] = max(best.get(name, 0.0), rate)
            base = best["granite (4 attention)"]
            rows += [[name, b, f"{rate:.0f}", f"{rate / base:.2f}"] for name, rate in best.items()]
    print(markdown_table(["model", "batch", "decode tok/s", "vs attention"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
