"""Speculative decoding with n-gram drafts on the CPU: output tok/s with and without it, side by
side in one run, on a workload where drafts help and one where they do not.

- ``copy``: the embedded model asked to repeat (or lightly edit) a piece of code given in its
  prompt, greedy: the text it writes is in its prompt, so prompt lookup finds it.
- ``chat``: open questions, greedy: little of the answer is in the prompt.

Each workload runs on three engines over the same weights (plain; ``--speculative-config``
ngram with ``"adaptive": false``, every match drafting up to k tokens; ngram adaptive, the
default, where low-acceptance sequences draft fewer or none), the engines stepping in turn on
the same requests (`run_together`: each one's time is the sum of its own steps, so the shared
machine's load changes fall on all alike), ``--reps`` times, best run of each.
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


ENGINES = {"fixed": {"adaptive": False}, "adaptive": {}, "previous": {}}


def one_floor(engine) -> None:
    """The engine's proposer with `ngram.FLOOR` as its floor whatever the batch (the adaptive rule
    before the floor rose with the batch), for side-by-side runs."""
    from pagoda.runtime.spec import ngram

    proposer = engine.drafter.proposer
    inner = proposer.propose

    def propose(*args, **kwargs):
        rising, ngram.floor = ngram.floor, lambda batch: ngram.FLOOR
        try:
            return inner(*args, **kwargs)
        finally:
            ngram.floor = rising

    proposer.propose = propose


def run(llm: LLM, prompts, params) -> tuple[float, list[list[int]]]:
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]


def run_together(llms: dict[str, LLM], prompts, params) -> dict[str, tuple[float, list]]:
    """The same requests on every engine, the engines stepping in turn (one step each, round
    and round): each engine's seconds are the sum of its own steps, so load changes on a shared
    machine fall on all of them alike. Per engine: (seconds, each request's token ids)."""
    tag = str(time.monotonic_ns())
    for llm in llms.values():
        for i, p in enumerate(prompts):
            llm.engine.add_request(f"{tag}-{i}", p, params)
    secs = dict.fromkeys(llms, 0.0)
    tokens = {name: [[] for _ in prompts] for name in llms}
    live = dict(llms)
    while live:
        for name, llm in list(live.items()):
            core = llm.engine
            if not core.has_unfinished_requests():
                del live[name]
                continue
            t = time.perf_counter()
            outs = core.step()
            secs[name] += time.perf_counter() - t
            for o in outs:
                tokens[name][int(o.request_id.rsplit("-", 1)[1])] += o.new_token_ids
    return {name: (secs[name], tokens[name]) for name in llms}


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
    ap.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["fixed", "adaptive"],
                    help="drafting engines beside plain (previous: adaptive with the floor of "
                    "1-2 decodes at every batch size, the rule before `ngram.floor`)")  # fmt: skip
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start, {os.cpu_count()} CPUs")
    loaded = load_model("smollm2-135m")
    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.lookup_max, "prompt_lookup_min": args.lookup_min}  # fmt: skip
    common = dict(loaded=loaded, dtype=args.dtype, max_model_len=2048,
                  max_num_seqs=max(args.batches), kv_cache_memory=256 << 20)  # fmt: skip
    plain = LLM(**common)
    drafted = {}
    for e in args.engines:
        drafted[f"ngram {e}"] = LLM(**common, speculative_config={**spec, **ENGINES[e]})
        if e == "previous":
            one_floor(drafted[f"ngram {e}"].engine)
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
            same = {}
            for e, llm in drafted.items():
                llm.engine.spec_stats.reset()
                spent[e].clear()
            for _ in range(args.reps):
                got = run_together({"plain": plain, **drafted}, batch, params)
                want = got["plain"][1]
                for e, (secs, tokens) in got.items():
                    best[e] = min(best[e], secs)
                    same[e] = same.get(e, True) and tokens == want
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
            print(*rows[-1 - len(drafted) :], sep="\n", flush=True)
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
