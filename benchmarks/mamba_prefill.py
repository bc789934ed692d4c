"""Prefill steps of a hybrid model (Granite 4.0: Mamba2 + attention layers) whose prompts differ
in length, on this machine: each step's wall time, its measured peak of temporaries and the
chunked scan's estimate (`mamba2.scan_bytes`, what the fit check keeps free), for this tree
and, with ``--old-ref``, for another commit's runtime, each in a child process, alternating.

Each case is one engine step (every prompt fits the token budget; one output token each): one
long prompt beside 15 short ones (what padding to the longest prompt made cost 16 long ones),
8 prompts of equal length, a single long prompt. The model is written by transformers with
random weights (hidden 256, 4 layers: three Mamba2 layers and one attention layer; 8 Mamba
heads of 64, d_state 64, the SSD chunk 256 as Granite 4.0's), float32. Peak: the bytes of the
storages the step's ops create and some tensor still holds, op by op (a TorchDispatchMode: an
allocator's peak, measured on the CPU), in a run of its own (not timed): the step's, and the
largest of its Mamba layers' prefill (`Mamba2Mixer._prefill`: the conv and the scan) alone.

    .venv/bin/python -P benchmarks/mamba_prefill.py [--old-ref main] [--rounds 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from common import machine, markdown_table
from live_bytes import LiveBytes

SHAPE = dict(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=8192,
             layer_types=["mamba", "mamba", "attention", "mamba"], mamba_n_heads=8,
             mamba_d_head=64, mamba_d_state=64, mamba_chunk_size=256, num_local_experts=0,
             shared_intermediate_size=512)  # fmt: skip
CASES = {  # name: prompt lengths, one step
    "1 x 2048 + 15 x 100": [2048] + [100] * 15,
    "8 x 512": [512] * 8,
    "1 x 4096": [4096],
}


def prompts(lens: list[int]) -> list[dict]:
    return [{"prompt_token_ids": [(7 * i + 3 * b) % 990 + 5 for i in range(n)]}
            for b, n in enumerate(lens)]  # fmt: skip


def child(path: str, repeats: int) -> None:
    import pagoda.runtime
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.model import mamba2
    from pagoda.runtime.model.loader import load_model

    llm = LLM(loaded=load_model(path), dtype="float32", max_num_seqs=16,
              max_num_batched_tokens=8192, kv_cache_memory=512 << 20)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    mc = llm.engine.runner.model_config
    rows = {}
    for name, lens in CASES.items():
        ps = prompts(lens)
        llm.generate(ps, params, use_tqdm=False)  # warm
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            llm.generate(ps, params, use_tqdm=False)
            best = min(best, time.perf_counter() - t)
        with LiveBytes() as live:
            llm.generate(ps, params, use_tqdm=False)
        mixer = []  # each Mamba layer's prefill (conv and scan) alone
        prefill = mamba2.Mamba2Mixer._prefill

        def measured(*args, _prefill=prefill, _peaks=mixer):
            with LiveBytes() as one:
                out = _prefill(*args)
            _peaks.append(one.peak)
            return out

        mamba2.Mamba2Mixer._prefill = measured
        llm.generate(ps, params, use_tqdm=False)
        mamba2.Mamba2Mixer._prefill = prefill
        try:
            est = mamba2.scan_bytes(mc, sum(lens), len(lens))
        except TypeError:  # the runtime before the packed layout: tokens alone
            est = mamba2.scan_bytes(mc, sum(lens))
        rows[name] = {"ms": best * 1e3, "peak": live.peak, "mixer": max(mixer), "estimate": est}
    print("RESULT " + json.dumps({"runtime": pagoda.runtime.__file__, "rows": rows}))


def run_child(path: str, repeats: int, tree: str | None) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    cmd = [sys.executable, "-P", __file__, "--child", path, "--repeats", str(repeats)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode or not lines:
        raise RuntimeError(f"child failed:\n{res.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    if tree is not None and not result["runtime"].startswith(str(Path(tree).parent)):
        raise RuntimeError(f"the child imported {result['runtime']}, not {tree}")
    return result["rows"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", help="also run the runtime of this git commit (before/after)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps per case (best)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.repeats)
        return 0
    from hf_oracle import make_tiny_model
    from long_context import _old_tree

    print(machine(), f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "granite4"
        model.mkdir()
        make_tiny_model(model, "GraniteMoeHybrid", **SHAPE)
        trees = {"after": None}
        if args.old_ref:
            (Path(tmp) / "old").mkdir()
            trees = {"before": str(_old_tree(args.old_ref, Path(tmp) / "old")), **trees}
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        for r in range(args.rounds):  # who goes first alternates: drift hits both alike
            for label, tree in list(trees.items())[:: 1 if r % 2 == 0 else -1]:
                runs[label].append(run_child(str(model), args.repeats, tree))
                print(f"  round {r + 1} done: {label}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    mib = 1 << 20
    table = []
    for name, lens in CASES.items():
        row = [name, sum(lens)]
        for label in trees:
            med = {f: statistics.median(run[name][f] for run in runs[label])
                   for f in ("ms", "peak", "mixer", "estimate")}  # fmt: skip
            row += [
                f"{med['ms']:.0f}",
                *(f"{med[f] / mib:.0f}" for f in ("peak", "mixer", "estimate")),
            ]
        if "before" in trees:
            b, a = (statistics.median(run[name]["ms"] for run in runs[k]) for k in trees)
            row.append(f"{b / a:.2f}x")
        table.append(row)
    heads = ["case", "tokens"]
    for label in trees:
        heads += [f"step ms {label}", f"step peak MiB {label}", f"mixer peak MiB {label}",
                  f"scan est. MiB {label}"]  # fmt: skip
    if "before" in trees:
        heads.append("speed-up")
    where = f"before = {args.old_ref}, after = this tree; " if args.old_ref else ""
    print(f"\none prefill step per case ({where}medians of {args.rounds} rounds):")
    print(markdown_table(heads, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
