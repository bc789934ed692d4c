"""Speculative decoding with n-gram drafts on the CPU: output tok/s with and without it, side by
side in one run, on a workload where drafts help and one where they do not.

- ``copy``: the embedded model asked to repeat (or lightly edit) a piece of code given in its
  prompt, greedy: the text it writes is in its prompt, so prompt lookup finds it.
- ``chat``: open questions, greedy: little of the answer is in the prompt.

Each workload runs on three engines over the same weights (plain; ``--speculative-config``
ngram with ``"adaptive": false``, every match drafting up to k tokens; ngram adaptive, the
default, where low-acceptance sequences draft fewer or none), alternating ``--reps`` times (the
machine is shared: alternation keeps load changes from favouring one side), best run of each.
Printed per workload and batch: output tokens, seconds, tok/s, the ratio to plain, the
acceptance rate (accepted / draft tokens), tokens gained per drafted step, draft tokens per
output token, the proposer's time per step, and whether the engines wrote the same tokens as
plain (they must)::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/spec_decode.py --batches 1 8
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import inspect
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, markdown_table
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "What are the benefits of regular exercise?",
    "Explain how a rainbow forms.",
    "Give me three ideas for a birthday party.",
    "Why is the sky blue?",
    "Describe your ideal weekend.",
    "What should I pack for a hiking trip?",
    "How do bees make honey?",
]


def _snippets(n: int) -> list[str]:
    """`n` short Python functions of the standard library (fixed for a Python version)."""
    import json.decoder
    import textwrap

    funcs = [textwrap.dedent, textwrap.indent, textwrap.shorten, json.decoder.py_scanstring,
             inspect.cleandoc, inspect.getmodulename, inspect.ismethod, inspect.isclass]  # fmt: skip
    return [inspect.getsource(funcs[i % len(funcs)])[:900] for i in range(n)]


def _chat(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )


def workloads(tokenizer, n: int) -> dict[str, list[list[int]]]:
    copy = [_chat(tokenizer, f"Repeat this code exactly, with no comment:\n\n{s}")
            for s in _snippets(n)]  # fmt: skip
    chat = [_chat(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
    return {"copy": copy, "chat": chat}


def timed_proposer(engine) -> list[float]:
    """Wrap the engine's `drafter.propose` to collect its seconds per call."""
    spent: list[float] = []
    drafter = engine.drafter
    inner = drafter.propose

    def propose(running) -> None:
        t = time.perf_counter()
        inner(running)
        spent.append(time.perf_counter() - t)

    drafter.propose = propose
    return spent


def run(llm: LLM, prompts, params) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--workloads", nargs="+", choices=["copy", "chat"], default=["copy", "chat"])
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start, {os.cpu_count()} CPUs")
    loaded = load_model("smollm2-135m")
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.lookup_max, "prompt_lookup_min": args.lookup_min}  # fmt: skip
    common = dict(loaded=loaded, dtype=args.dtype, max_model_len=2048,
                  max_num_seqs=max(args.batches), kv_cache_memory=256 << 20)  # fmt: skip
    plain = LLM(**common)
    drafted = {"ngram fixed": LLM(**common, speculative_config={**spec, "adaptive": False}),
               "ngram adaptive": LLM(**common, speculative_config=spec)}  # fmt: skip
    spent = {name: timed_proposer(llm.engine) for name, llm in drafted.items()}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    loads = workloads(loaded.tokenizer, max(args.batches))
    rows = []
    for name in args.workloads:
        prompts = loads[name]
        for b in args.batches:
            batch = prompts[:b]
            for llm in (plain, *drafted.values()):  # warm all
                run(llm, batch[:1], SamplingParams(temperature=0, max_tokens=4))
            best = {"plain": float("inf")} | {e: float("inf") for e in drafted}
            same = dict.fromkeys(drafted, True)
            for e, llm in drafted.items():
                llm.engine.spec_stats.reset()
                spent[e].clear()
            for _ in range(args.reps):
                t_plain, want = run(plain, batch, params)
                best["plain"] = min(best["plain"], t_plain)
                for e, llm in drafted.items():
                    t_spec, got = run(llm, batch, params)
                    best[e] = min(best[e], t_spec)
                    same[e] &= got == want
            tokens = sum(len(t) for t in want)
            rows.append([name, b, "plain", tokens, f"{best['plain']:.2f}",
                         f"{tokens / best['plain']:.1f}", "1.00x", "", "", "", "", ""])  # fmt: skip
            for e, llm in drafted.items():
                stats, secs = llm.engine.spec_stats, best[e]
                ms = 1e3 * sum(spent[e]) / max(len(spent[e]), 1)
                per_token = stats.num_draft_tokens / (tokens * args.reps)
                rows.append([
                    name, b, e, tokens, f"{secs:.2f}", f"{tokens / secs:.1f}",
                    f"{best['plain'] / secs:.2f}x", f"{100 * (stats.acceptance_rate or 0):.0f}%",
                    f"{stats.mean_acceptance_length or 1:.2f}", f"{per_token:.2f}", f"{ms:.2f}",
                    str(same[e]),
                ])  # fmt: skip
            print(*rows[-3:], sep="\n", flush=True)
    print()
    print(markdown_table(
        ["workload", "batch", "engine", "output tokens", "s (best)", "output tok/s", "vs plain",
         "acceptance", "tokens / drafted step", "draft tokens / output token",
         "proposer ms / step", "same tokens"],
        rows,
    ))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
