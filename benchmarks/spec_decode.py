"""Speculative decoding with n-gram drafts on the CPU: output tok/s with and without it, side by
side in one run, on a workload where drafts help and one where they do not; with ``--draft``,
drafts of a draft model instead.

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

``--draft``: method "draft_model" against plain, on a random-weight target written with
transformers (no small checkpoint shares the embedded model's vocabulary) and a draft that is a
copy of its first ``--draft-layers`` layers, embeddings, final norm and LM head. The target's
later layers have their output projections (attention's o_proj, the MLP's down_proj) scaled by
``--damp``, so they move the residual stream little and the truncated copy's greedy tokens are
often the target's (its LM head is scaled by `HEAD_SCALE`, so a greedy pick is not a near
tie that any later layer flips): the acceptance is set by construction (printed), not a property of any
real pair of models; what the run measures is what a step costs with the draft's k forwards and
the verification rows at that acceptance. Random prompts, greedy::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/spec_decode.py --draft --batches 1 8

``--temperature T`` (> 0) samples instead (``ignore_eos``, so every engine writes as many
tokens): the draft model's engine then drafts from its own distribution and verifies by
rejection sampling (`spec/rejection.py`); beside it a third engine keeps the earlier rule,
greedy drafts kept iff the target's own draw is them (its draft model patched to draft
greedily), so the two acceptances compare on the same pair. Sampled engines write other tokens
than plain ("same tokens": n/a)::

    OMP_WAIT_POLICY=PASSIVE python -P benchmarks/spec_decode.py --draft --temperature 0.7

``--async-scheduling``: beside each drafting engine its twin with ``--async-scheduling`` (a
request that takes drafts is scheduled once its step is read back; docs/runtime.md), on the
same requests in the same rounds. On the CPU the forward runs on the host, so there is nothing
to overlap: the twin measures what async scheduling costs there, not what it hides on a GPU.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
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


HEAD_SCALE = 8.0  # the synthetic target's LM head scaled up: greedy picks well separated


def synthetic_pair(root: Path, args) -> tuple[Path, Path]:
    """A random-weight Llama target and its truncated copy as the draft (module docstring),
    written to `root` with a word-level tokenizer; (target, draft) paths."""
    import torch
    import transformers
    from hf_oracle import save_word_tokenizer

    vocab = 4096
    cfg = dict(vocab_size=vocab, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
               num_key_value_heads=4, max_position_embeddings=2048, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**cfg, num_hidden_layers=args.target_layers)
    )
    with torch.no_grad():
        target.lm_head.weight.mul_(HEAD_SCALE)
        for layer in target.model.layers[args.draft_layers :]:
            layer.self_attn.o_proj.weight.mul_(args.damp)
            layer.mlp.down_proj.weight.mul_(args.damp)
    draft = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**cfg, num_hidden_layers=args.draft_layers)
    )
    draft.load_state_dict(target.state_dict(), strict=False)  # (the later layers' left out)
    paths = root / "target", root / "draft"
    for model, path in zip((target, draft), paths):
        model.save_pretrained(path)
        save_word_tokenizer(path, vocab)
    return paths


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


def measure(name, b, plain, drafted, batch, params, reps, spent) -> list[list]:
    """The table rows of one workload and batch: plain, then each drafting engine, stepping in
    turn on the same requests (`run_together`), best of `reps`."""
    for llm in (plain, *drafted.values()):  # warm all
        run(llm, batch[:1], SamplingParams(temperature=0, max_tokens=4))
    best = {"plain": float("inf")} | {e: float("inf") for e in drafted}
    same = {}
    for e, llm in drafted.items():
        llm.engine.spec_stats.reset()
        spent[e].clear()
    for _ in range(reps):
        got = run_together({"plain": plain, **drafted}, batch, params)
        want = got["plain"][1]
        for e, (secs, tokens) in got.items():
            best[e] = min(best[e], secs)
            same[e] = same.get(e, True) and tokens == want
    tokens = sum(len(t) for t in want)
    sampled = params.temperature > 0  # (the engines' tokens differ; ignore_eos: as many)
    rows = [[name, b, "plain", tokens, f"{best['plain']:.2f}", f"{tokens / best['plain']:.1f}",
             "1.00x", "", "", "", "", ""]]  # fmt: skip
    for e, llm in drafted.items():
        stats, secs = llm.engine.spec_stats, best[e]
        ms = 1e3 * sum(spent[e]) / max(len(spent[e]), 1)
        per_token = stats.num_draft_tokens / (tokens * reps)
        rows.append([
            name, b, e, tokens, f"{secs:.2f}", f"{tokens / secs:.1f}",
            f"{best['plain'] / secs:.2f}x", f"{100 * (stats.acceptance_rate or 0):.0f}%",
            f"{stats.mean_acceptance_length or 1:.2f}", f"{per_token:.2f}", f"{ms:.2f}",
            "n/a" if sampled else str(same[e]),
        ])  # fmt: skip
    print(*rows, sep="\n", flush=True)
    return rows


GREEDY_RULE = "greedy drafts, kept iff drawn"  # (its draft model patched: no async twin)


def twin_kwargs(args, common: dict, llm: LLM) -> dict:
    """`common` as the drafting engine `llm` was built with (`--draft`: its synthetic target)."""
    if not args.draft:
        return common
    kw = {k: v for k, v in common.items() if k != "loaded"}
    return dict(kw, model=llm.engine.config.model)


def draft_engines(args, common: dict) -> tuple[LLM, dict[str, LLM], dict[str, list[list[int]]]]:
    """`--draft`: plain and draft-model engines on the synthetic pair, and random prompts."""
    import random
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="spec-draft-"))
    target, draft = synthetic_pair(root, args)
    common = dict(common, model=str(target))
    del common["loaded"]
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": args.k}
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 4096) for _ in range(rng.randrange(32, 96))]
               for _ in range(max(args.batches))]  # fmt: skip
    name = f"draft model ({args.draft_layers} of {args.target_layers} layers)"
    engines = {name: LLM(**common, speculative_config=spec)}
    if args.temperature > 0:  # the earlier rule beside it (module docstring)
        engines[GREEDY_RULE] = greedy = LLM(**common, speculative_config=spec)
        greedy.engine.runner.draft._sampler = lambda *_: lambda j, logits: logits.argmax(dim=-1)
    return LLM(**common), engines, {"random": prompts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (0: greedy; module docstring)")  # fmt: skip
    ap.add_argument("--workloads", nargs="+", choices=["copy", "chat"], default=["copy", "chat"])
    ap.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["fixed", "adaptive"],
                    help="drafting engines beside plain (previous: adaptive with the floor of "
                    "1-2 decodes at every batch size, the rule before `ngram.floor`)")  # fmt: skip
    ap.add_argument(
        "--draft",
        action="store_true",
        help="a draft model's drafts on a synthetic target (module docstring)",
    )
    ap.add_argument("--target-layers", type=int, default=12)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--damp", type=float, default=0.02,
                    help="the target's later layers' output projections scaled by this")  # fmt: skip
    ap.add_argument("--async-scheduling", action="store_true",
                    help="beside each drafting engine, the same with --async-scheduling")  # fmt: skip
    args = ap.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at start, {os.cpu_count()} CPUs")
    common = dict(loaded=None, dtype=args.dtype, max_model_len=2048,
                  max_num_seqs=max(args.batches), kv_cache_memory=256 << 20)  # fmt: skip
    if args.draft:
        plain, drafted, loads = draft_engines(args, common)
    else:
        common["loaded"] = loaded = load_model("smollm2-135m")
        spec = {"method": "ngram", "num_speculative_tokens": args.k,
                "prompt_lookup_max": args.lookup_max, "prompt_lookup_min": args.lookup_min}  # fmt: skip
        plain, drafted = LLM(**common), {}
        for e in args.engines:
            drafted[f"ngram {e}"] = LLM(**common, speculative_config={**spec, **ENGINES[e]})
            if e == "previous":
                one_floor(drafted[f"ngram {e}"].engine)
        loads = workloads(loaded.tokenizer, max(args.batches))
        loads = {name: loads[name] for name in args.workloads}
    if args.async_scheduling:  # each drafting engine's twin, the next step launched early
        for e in [e for e in drafted if e != GREEDY_RULE]:
            spec = drafted[e].engine.config.speculative_config
            drafted[f"{e}, async"] = LLM(**twin_kwargs(args, common, drafted[e]),
                                         speculative_config=spec, async_scheduling=True)  # fmt: skip
    # the proposer's time: with a draft model, only handing the held drafts out (its forwards
    # are in the runner's step)
    spent = {name: timed_proposer(llm.engine) for name, llm in drafted.items()}
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=args.temperature > 0)  # fmt: skip
    rows = []
    for name, prompts in loads.items():
        for b in args.batches:
            rows += measure(name, b, plain, drafted, prompts[:b], params, args.reps, spent)
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
