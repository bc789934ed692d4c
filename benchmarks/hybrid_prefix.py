"""A shared system prompt on a hybrid model (Granite 4.0: Mamba2 + attention layers), with prefix
caching (KV blocks and Mamba state snapshots, `core/state_snapshots.py`) and without it (what
the engine did for hybrids before), on this machine, alternating in one process.

The model is `mamba_prefill.py`'s shape, written by transformers with random weights (hidden
256, three Mamba2 layers and one attention layer, 8 heads of 64, d_state 64, the SSD chunk 256
as Granite 4.0's), float32. A workload: a `--system`-token system prompt, then `--requests`
requests of it plus 64 tokens of their own, one after another (8 new tokens each, greedy): the
first request's time (a cold cache: it saves the snapshots) and the median of the others' (a
warm one: they restore the state at the system prompt's last snapshot boundary); their tokens
must be the same either way.

    .venv/bin/python -P benchmarks/hybrid_prefix.py [--system 2048] [--requests 6] [--rounds 2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from common import machine, markdown_table
from mamba_prefill import SHAPE


def run(loaded, reqs: list[list[int]], caching: bool) -> tuple[list[float], list, int]:
    """(each request's seconds, its tokens, prompt tokens served from the cache)."""
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=512 << 20,
              max_num_batched_tokens=2048, enable_prefix_caching=caching)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    times, tokens = [], []
    for p in reqs:
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], params)[0]
        times.append(time.perf_counter() - t)
        tokens.append(out.outputs[0].token_ids)
    return times, tokens, llm.engine.kv.prefix_hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", type=int, default=2048, help="system prompt tokens")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    from hf_oracle import make_tiny_model
    from pagoda.runtime.model.loader import load_model

    path = Path(tempfile.mkdtemp(prefix="hybrid-prefix-"))
    make_tiny_model(path, "GraniteMoeHybrid", **SHAPE)
    loaded = load_model(str(path))
    system = [(7 * i + 3) % 990 + 5 for i in range(args.system)]
    reqs = [system + [(13 * i + j) % 990 + 5 for i in range(64)] for j in range(args.requests)]
    print(machine(), f"load {os.getloadavg()[0]:.1f}", flush=True)
    first: dict[bool, list[float]] = {False: [], True: []}
    later: dict[bool, list[float]] = {False: [], True: []}
    tokens, hits = {}, {}
    for _ in range(args.rounds):
        for caching in (False, True):
            times, tokens[caching], hits[caching] = run(loaded, reqs, caching)
            first[caching].append(times[0])
            later[caching] += times[1:]
    assert tokens[False] == tokens[True], "prefix caching changed the tokens"
    rows = []
    for caching in (False, True):
        rows.append(["on" if caching else "off", f"{statistics.median(first[caching]):.3f}",
                     f"{statistics.median(later[caching]):.3f}", str(hits[caching])])  # fmt: skip
    print(markdown_table(["prefix caching", "first s", "later s (median)", "tokens cached"], rows))
    ratio = statistics.median(later[False]) / statistics.median(later[True])
    print(f"later requests {ratio:.1f}x faster with prefix caching; same tokens; "
          f"load {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
