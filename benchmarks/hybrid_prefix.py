"""A shared system prompt on the recurrent families (Granite 4.0: Mamba2 + attention layers;
Mamba-1 alone; Jamba: Mamba-1 + attention layers, experts; LFM2: short convs + attention
layers), with prefix caching (KV blocks and the recurrent state snapshots,
`core/state_snapshots.py`) and without it (what the engine did for these models before), on
this machine, alternating in one process.

The models are written by transformers with random weights, float32: Granite 4.0 in
`mamba_prefill.py`'s shape (hidden 256, three Mamba2 layers and one attention layer, 8 heads
of 64, d_state 64, the SSD chunk 256 as Granite 4.0's); the others in
`recurrent_families.py`'s (hidden 256, 4 layers: Mamba-1 d_inner 512, d_state 16; Jamba three
Mamba-1 layers and one attention layer, 4 experts top 2 on two; LFM2 three conv layers and one
attention layer). A workload: a `--system`-token system prompt, then `--requests` requests of
it plus 64 tokens of their own, one after another (8 new tokens each, greedy): the time to the
first token of the first request (a cold cache: it saves the snapshots) and the median of the
others' (a warm one: they restore the state at the system prompt's last snapshot boundary);
their tokens must be the same either way.

    .venv/bin/python -P benchmarks/hybrid_prefix.py [--system 2048] [--requests 6] [--rounds 2]
        [--families granite4 mamba1 jamba lfm2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other CPU benchmarks (busy cores)

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from common import machine, markdown_table
from mamba_prefill import SHAPE

SMALL = dict(
    vocab_size=1000, hidden_size=256, num_hidden_layers=4, max_position_embeddings=8192
)  # (recurrent_families.py's, a longer context)
FAMILIES = {  # name: (transformers config class prefix, config)
    "granite4": ("GraniteMoeHybrid", SHAPE),
    "mamba1": ("Mamba", dict(SMALL, state_size=16)),
    "jamba": ("Jamba", dict(SMALL, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=512, attn_layer_period=4, attn_layer_offset=2,
                            expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                            mamba_d_state=16)),
    "lfm2": ("Lfm2", dict(SMALL, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=768,
                          layer_types=["conv", "conv", "full_attention", "conv"])),
}  # fmt: skip


def run(loaded, reqs: list[list[int]], caching: bool) -> tuple[list[float], list, int]:
    """(each request's seconds to its first token, its tokens, prompt tokens served from the
    cache): the requests one after another on one engine."""
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=512 << 20,
              max_num_batched_tokens=2048, enable_prefix_caching=caching)  # fmt: skip
    core = llm.engine
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    times, tokens = [], []
    for i, p in enumerate(reqs):
        core.add_request(str(i), p, params)
        got, first = [], None
        while core.has_unfinished_requests():
            for out in core.step():
                if out.new_token_ids and first is None:
                    first = out.first_token_time - out.arrival_time
                got += out.new_token_ids
        times.append(first)
        tokens.append(got)
    return times, tokens, core.kv.prefix_hits


def family(loaded, args) -> list[list[str]]:
    """One family's rows: prefix caching off and on, alternating `--rounds` times."""
    system = [(7 * i + 3) % 990 + 5 for i in range(args.system)]
    reqs = [system + [(13 * i + j) % 990 + 5 for i in range(64)] for j in range(args.requests)]
    first: dict[bool, list[float]] = {False: [], True: []}
    later: dict[bool, list[float]] = {False: [], True: []}
    tokens, hits = {}, {}
    for _ in range(args.rounds):
        for caching in (False, True):
            times, tokens[caching], hits[caching] = run(loaded, reqs, caching)
            first[caching].append(times[0])
            later[caching] += times[1:]
    assert tokens[False] == tokens[True], "prefix caching changed the tokens"
    med = {c: statistics.median(later[c]) for c in (False, True)}
    return [["on" if c else "off", f"{statistics.median(first[c]):.3f}", f"{med[c]:.3f}",
             str(hits[c]), "" if not c else f"{med[False] / med[True]:.1f}x"]
            for c in (False, True)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", type=int, default=2048, help="system prompt tokens")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    args = ap.parse_args(argv)
    from hf_oracle import make_tiny_model
    from pagoda.runtime.model.loader import load_model

    print(machine(), f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for name in args.families:
        arch, shape = FAMILIES[name]
        path = Path(tempfile.mkdtemp(prefix=f"hybrid-prefix-{name}-"))
        make_tiny_model(path, arch, **shape)
        rows += [[name, *row] for row in family(load_model(str(path)), args)]
        print(f"{name} done, load {os.getloadavg()[0]:.1f}", flush=True)
    print(markdown_table(["model", "prefix caching", "first TTFT s", "later TTFT s (median)",
                          "tokens cached", "later speed-up"], rows))  # fmt: skip
    print(f"same tokens with and without; load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
