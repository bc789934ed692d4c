"""Start to ready of `pagoda serve` with the embedded model, timed from outside: process start
→ the first `/ready` 200. Engine core in its own process (the default) and on a thread
(`--no-engine-process`) interleaved, `--rounds` times each, with the log's milestones (seconds
after start) so the breakdown shows where the time goes.

    .venv/bin/python -P benchmarks/start_to_ready.py                  # 3 rounds (~6 min here)
    .venv/bin/python -P benchmarks/start_to_ready.py --rounds 1 --modes process
    .venv/bin/python -P benchmarks/start_to_ready.py --old-ref HEAD~3   # + that commit's runtime
    .venv/bin/python -P benchmarks/start_to_ready.py --checks 5 --rounds 0 --old-ref main

With `--old-ref`, each mode also runs on that commit's runtime (`git archive`d to a temporary
folder and put first on PYTHONPATH), interleaved with this tree's, so before and after share
the machine's load. `--checks N` first times the start-up reads of the model on their own, N
fresh processes per runtime, interleaved: `launch.preflight` (the flags, the model's config, the
weights count of the fit and memory checks; `pagoda serve` runs them in its engine process) and
then the tokenizer (`loader.read_tokenizer`), each in a fresh process's first call.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# common and long_context (torch: ~2 s of CPU) are imported once the arguments are parsed:
# gpu_check.sh's dry run stops there (tests/benchmarks/test_gpu_check.py runs it on a CPU)

MODES = {"process": [], "thread": ["--no-engine-process"]}
POLL_S = 0.02  # /ready is asked this often: the resolution of the figures
# log lines worth a column: (label, regex on the message)
MILESTONES = (
    ("listening", r"listening on"),
    ("factory received", r"engine modules imported"),
    ("core built", r"engine core built"),
    ("warm-up done", r"(?i)warm(ed)?[- ]up"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def start_once(mode: str, extra: list[str], timeout: float, tree: str | None = None) -> dict:
    """One start: seconds to ready, and each log line's time after the start; `tree`: a
    runtime to import instead of this one."""
    port = free_port()
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--log-level", "info", *MODES[mode], *extra]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.perf_counter() - t0, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not ready(port):
            if proc.poll() is not None:
                tail = "\n".join(ln for _, ln in lines[-20:])
                raise RuntimeError(f"{mode}: the server exited {proc.returncode}:\n{tail}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{mode}: not ready after {timeout:.0f} s")
            time.sleep(POLL_S)
        total = time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
    marks = {}
    for label, pattern in MILESTONES:
        hit = next((t for t, ln in lines if re.search(pattern, ln)), None)
        if hit is not None:
            marks[label] = hit
    return {"ready": total, "marks": marks, "log": lines}


CHECKS = """
import sys, time
from pagoda.runtime import options
from pagoda.runtime.model.loader import read_tokenizer
from pagoda.runtime.server.cli import build_parser, server_config
from pagoda.runtime.server.launch import preflight

args = build_parser().parse_args(sys.argv[1:])
t0 = time.perf_counter()
engine_cfg, _ = preflight(server_config(args), options.engine_kwargs(vars(args)))
t1 = time.perf_counter()
read_tokenizer(engine_cfg.model)
print(t1 - t0, time.perf_counter() - t1)
"""


def checks_once(extra: list[str], tree: str | None = None) -> tuple[float, float]:
    """Seconds of the API process's checks and then of its tokenizer, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=tree) if tree else None
    cmd = [sys.executable, "-P", "-c", CHECKS, *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    checks, tokenizer = (float(x) for x in out.split()[-2:])
    return checks, tokenizer


def report_checks(times: dict[str, list[tuple[float, float]]]) -> None:
    from common import markdown_table

    rows = []
    for tag, ts in times.items():
        checks = statistics.median(c for c, _ in ts)
        tok = statistics.median(t for _, t in ts)
        both = [c + t for c, t in ts]
        spread = f"{min(both) * 1e3:.0f}-{max(both) * 1e3:.0f}"
        rows.append([tag.strip(" ()") or "this tree", f"{checks * 1e3:.0f}", f"{tok * 1e3:.0f}",
                     f"{statistics.median(both) * 1e3:.0f}", spread])  # fmt: skip
    print(f"\nthe API process's start-up reads, ms, medians of {len(ts)} fresh processes:")
    print(markdown_table(["runtime", "checks (preflight)", "tokenizer", "both", "range"], rows))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--old-ref", help="also start the runtime of this git commit (before/after)")
    ap.add_argument("--show-log", action="store_true", help="print each start's timed log")
    ap.add_argument("--checks", type=int, default=0, metavar="N",
                    help="first time the API process's start-up reads alone, N times")  # fmt: skip
    ap.add_argument("extra", nargs="*", help="more `pagoda serve` flags (after --)")
    args = ap.parse_args(argv)
    from common import machine, markdown_table
    from long_context import _old_tree

    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"": None}
        if args.old_ref:
            trees = {f" ({args.old_ref})": str(_old_tree(args.old_ref, Path(tmp))), "": None}
        if args.checks:
            checks: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
            for _ in range(args.checks):
                for tag, tree in trees.items():
                    checks[tag].append(checks_once(args.extra, tree))
            report_checks(checks)
        runs: dict[str, list[dict]] = {m + t: [] for m in args.modes for t in trees}
        for i in range(args.rounds):
            for mode in args.modes:
                for tag, tree in trees.items():
                    r = start_once(mode, args.extra, args.timeout, tree)
                    runs[mode + tag].append(r)
                    print(
                        f"  round {i + 1} {mode}{tag}: ready after {r['ready']:.1f} s", flush=True
                    )
                    if args.show_log:
                        for t, ln in r["log"]:
                            print(f"    {t:6.1f}  {ln[:160]}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    if not args.rounds:
        return
    labels = [label for label, _ in MILESTONES]
    rows = []
    for mode, rs in runs.items():
        cells = []
        for label in labels:
            ts = [r["marks"][label] for r in rs if label in r["marks"]]
            cells.append(f"{statistics.median(ts):.1f}" if ts else "-")
        readies = [r["ready"] for r in rs]
        spread = f"{min(readies):.1f}-{max(readies):.1f}"
        rows.append([mode, *cells, f"{statistics.median(readies):.1f}", spread])
    print(f"\nseconds after process start, medians of {args.rounds} interleaved rounds:")
    print(markdown_table(["engine core", *labels, "ready (200)", "range"], rows))


if __name__ == "__main__":
    main()
