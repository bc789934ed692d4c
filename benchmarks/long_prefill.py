"""Short streams beside one long prompt: the long-prefill cap (`--long-prefill-token-threshold`)
against no cap, alternating in one run on the same weights.

Offline engines (no HTTP: less noise on a shared machine), one per threshold. ``--clients``
closed-loop streaming clients each send a short prompt (``--short-len`` random tokens,
``--short-out`` tokens out, ``ignore_eos``) and a new one as soon as it finishes; once all of them
decode, one ``--long-len``-token prompt arrives, and while it prefills one more short request
arrives every ``--arrival-every`` seconds (open loop: its TTFT counts from when it was due). The window runs from its arrival to its first
token. Per engine, over the window: the short streams' inter-token gaps (max, p99, p50; the time
between two tokens of one request, as a streaming client sees them), the TTFT of the short
requests sent in it (their first token may come after it), the long request's TTFT (the
window), the CPU time this process spent in it (the work; less sensitive than wall time to other
load on a shared machine) and the tokens the steps computed per second of it (prompt and output
tokens: total throughput), also per CPU second. Threshold 0 is the scheduler without the cap
(the same code path as before the cap existed). Rounds alternate the engines' order so that
drift of a shared machine hits both alike.

    python -P benchmarks/long_prefill.py                         # 0 vs 256, 8,190-token prompt
    python -P benchmarks/long_prefill.py --thresholds 0 256 512 --rounds 3 --ragged 32

``--ragged N``: also a throughput check, N prompts of 16-1,024 tokens (offline_throughput.py's
ragged batch, 128 tokens out each) through ``LLM.generate`` per threshold, alternating: output
tokens per second and per CPU second, and whether every engine gave the same tokens.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and OpenMP) load

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import kv_bytes_per_token, machine, markdown_table, ragged_workload
from pagoda.runtime import LLM, SamplingParams


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Run:
    """One window of one engine: N short closed-loop streams, then the long prompt."""

    def __init__(self, llm: LLM, args: argparse.Namespace, seed: int) -> None:
        self.eng, self.args, self.rng = llm.engine, args, random.Random(seed)
        self.short = SamplingParams(temperature=0, max_tokens=args.short_out, ignore_eos=True)
        self.ids = 0
        self.last: dict[str, float] = {}  # request → time of its last token (or its arrival)
        self.sent: dict[str, float] = {}
        self.gaps: list[float] = []
        self.ttfts: list[float] = []
        self.in_window: set[str] = set()  # short requests sent in the window, no token yet
        self.window = False
        self.due = float("inf")  # the next open-loop arrival
        self.tokens = 0  # tokens the steps computed, prompt and output
        sched = self.eng.scheduler
        update = sched.update_after_step

        def counted(out, _update=update):
            self.tokens += out.num_batched_tokens
            _update(out)

        sched.update_after_step = counted  # instance attribute: this engine only

    def _send_short(self, prefix: str = "s", at: float | None = None) -> None:
        """A short request; `at`: when it arrived (an open-loop arrival that came due during a
        step is taken in after it, as the engine takes in requests between steps)."""
        rid = f"{prefix}{self.ids}"
        self.ids += 1
        prompt = [self.rng.randrange(3, 40000) for _ in range(self.args.short_len)]
        self.eng.add_request(rid, prompt, self.short)
        self.sent[rid] = self.last[rid] = time.perf_counter() if at is None else at
        if self.window:
            self.in_window.add(rid)

    def _step(self) -> list:
        outs = self.eng.step()
        now = time.perf_counter()
        for o in outs:
            rid = o.request_id
            if rid == "long" or not o.new_token_ids:
                continue
            if rid in self.in_window:  # its first token, maybe after the window
                self.in_window.discard(rid)
                self.ttfts.append(now - self.sent[rid])
            elif self.window and o.num_output_tokens > len(o.new_token_ids):
                self.gaps.append(now - self.last[rid])
            self.last[rid] = now
            if o.finished:
                del self.last[rid]
                if rid.startswith("s"):  # a closed-loop client sends its next one
                    self._send_short()
        while self.window and now >= self.due:  # open-loop arrivals
            self._send_short("o", at=self.due)
            self.due += self.args.arrival_every
        return outs

    def run(self, long_prompt: list[int]) -> dict:
        for _ in range(self.args.clients):
            self._send_short()
        sched = self.eng.scheduler
        while sched.waiting or any(r.num_output_tokens == 0 for r in sched.running):
            self._step()  # every stream decoding
        self.tokens = 0
        self.window = True
        long_params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
        t0, c0 = time.perf_counter(), time.process_time()
        self.due = t0 + self.args.arrival_every
        self.eng.add_request("long", long_prompt, long_params)
        # a short request's gap that spans the long prompt's arrival counts from the arrival
        self.last = dict.fromkeys(self.last, t0)
        while True:
            outs = self._step()
            if any(o.request_id == "long" and o.new_token_ids for o in outs):
                break
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        tokens, self.window = self.tokens, False
        while self.in_window:  # the TTFT of every short request sent in the window
            self._step()
        for rid in list(self.last):
            self.eng.abort_request(rid)
        while self.eng.has_unfinished_requests():
            self.eng.step()
        return {
            "long_ttft": wall,
            "cpu_s": cpu,
            "gap_max": max(self.gaps, default=float("nan")),
            "gap_p99": pct(self.gaps, 0.99),
            "gap_p50": pct(self.gaps, 0.5),
            "short_ttft_p50": pct(self.ttfts, 0.5),
            "short_ttft_max": max(self.ttfts, default=float("nan")),
            "shorts": len(self.ttfts),
            "tok_s": tokens / wall,
            "tok_cpu_s": tokens / cpu,
        }


def ragged(loaded, args: argparse.Namespace) -> str:
    """The ragged offline batch through an engine per threshold (default budget and context)."""
    prompts = ragged_workload(loaded.tokenizer, args.ragged, 16, 1024, args.seed)
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llms = {
        t: LLM(loaded=loaded, max_model_len=2048, long_prefill_token_threshold=t)
        for t in args.thresholds
    }
    for llm in llms.values():  # untimed: first-touch of the cache, the kernels' first shapes
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    rates: dict[int, list[tuple[float, float]]] = {t: [] for t in args.thresholds}
    tokens = {}
    for r in range(args.rounds):
        for t in args.thresholds if r % 2 == 0 else args.thresholds[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            outs = llms[t].generate(prompts, params)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens[t] = [o.outputs[0].token_ids for o in outs]
            n = sum(map(len, tokens[t]))
            rates[t].append((n / wall, n / cpu))
            print(f"ragged round {r} threshold {t}: {n / wall:.1f} tok/s, {n / cpu:.1f} /CPU s")
    same = all(tokens[t] == tokens[args.thresholds[0]] for t in args.thresholds)
    rows = [
        [
            t or "off",
            f"{statistics.median(x[0] for x in rates[t]):.1f}",
            f"{statistics.median(x[1] for x in rates[t]):.1f}",
        ]
        for t in args.thresholds
    ]
    head = f"{args.ragged} ragged prompts (16-1,024 tokens, 128 out); same tokens: {same}"
    return head + "\n" + markdown_table(["threshold", "output tok/s", "output tok/CPU s"], rows)


def streams(loaded, args: argparse.Namespace) -> str:
    """The short streams beside one long prompt, an engine per threshold, rounds alternating."""
    max_len = args.long_len + 64
    seqs = args.clients + 1 + 16  # room for the open-loop arrivals
    kv = (seqs * (args.short_len + args.short_out) + max_len + 64 * seqs) * kv_bytes_per_token(
        loaded.config
    )
    engines = {
        t: LLM(
            loaded=loaded,
            max_model_len=max_len,
            max_num_seqs=seqs,
            max_num_batched_tokens=args.budget,
            kv_cache_memory=2 * kv,
            enable_prefix_caching=False,
            long_prefill_token_threshold=t,
        )
        for t in args.thresholds
    }
    results: dict[int, list[dict]] = {t: [] for t in args.thresholds}
    for r in range(args.rounds):
        rng = random.Random(args.seed + r)
        long_prompt = [rng.randrange(3, 40000) for _ in range(args.long_len)]
        order = args.thresholds if r % 2 == 0 else args.thresholds[::-1]
        for t in order:
            res = Run(engines[t], args, seed=args.seed + 100 * r).run(long_prompt)
            results[t].append(res)
            print(f"round {r} threshold {t}: " + ", ".join(f"{k} {v:.3g}" for k, v in res.items()))

    def med(t: int, key: str) -> float:
        return statistics.median(x[key] for x in results[t])

    rows = []
    for t in args.thresholds:
        rows.append([
            t or "off", f"{med(t, 'gap_max'):.2f}", f"{med(t, 'gap_p99'):.2f}",
            f"{med(t, 'gap_p50'):.3f}", f"{med(t, 'short_ttft_p50'):.2f}",
            f"{med(t, 'short_ttft_max'):.2f}", f"{med(t, 'long_ttft'):.2f}",
            f"{med(t, 'cpu_s'):.2f}", f"{med(t, 'tok_s'):.0f}", f"{med(t, 'tok_cpu_s'):.0f}",
        ])  # fmt: skip
    heads = ["threshold", "short gap max s", "gap p99 s", "gap p50 s", "short TTFT p50 s"]
    heads += ["short TTFT max s", "long TTFT s", "CPU s in it", "tokens/s", "tokens/CPU s"]
    head = (f"{args.clients} short streams ({args.short_len} in, {args.short_out} out) beside one "
            f"{args.long_len}-token prompt, a short arrival every {args.arrival_every:g} s, budget "
            f"{args.budget}; median of {args.rounds} rounds")  # fmt: skip
    return head + "\n" + markdown_table(heads, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresholds", type=int, nargs="+", default=[0, 256],
                    help="long_prefill_token_threshold per engine (0: no cap)")  # fmt: skip
    ap.add_argument("--clients", type=int, default=4, help="short streaming clients")
    ap.add_argument("--arrival-every", type=float, default=2.0,
                    help="seconds between open-loop short requests during the long prefill")  # fmt: skip
    ap.add_argument("--short-len", type=int, default=64)
    ap.add_argument("--short-out", type=int, default=8)
    ap.add_argument("--long-len", type=int, default=8190, help="0: only the --ragged check")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--rounds", type=int, default=2, help="windows per engine, order alternating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ragged", type=int, default=0, help="prompts of the throughput check")
    args = ap.parse_args(argv)
    print(machine())
    print(f"load average before: {loadavg()}")
    from pagoda.runtime.model.loader import load_model

    loaded = load_model("smollm2-135m")
    tables = [streams(loaded, args)] if args.long_len else []
    if args.ragged:
        tables.append(ragged(loaded, args))
    print(f"load average after: {loadavg()}")
    print("\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
