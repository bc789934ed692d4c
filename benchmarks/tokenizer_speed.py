"""Tokenizer costs of a git commit against this tree's, alternating in one process:

* tiktoken: building a Kimi K2-sized tiktoken vocabulary into a `tokenizers` BPE (what
  `pagoda serve` does once at start for Kimi K2 / Moonlight: `model/tiktoken_files.py`, the
  merges derived from the ranks). The ranks are `--ranks FILE` (a real `tiktoken.model`) or,
  without one, a byte-level BPE of `--size` tokens trained with `tokenizers` on the Python
  sources on this machine (the standard library and site-packages, up to 200 MB; cached in
  the temp directory), ranked in training order as tiktoken files are.
* gguf: encoding ~200 KB of this repository's docs with the embedded SmolLM2 GGUF's tokenizer
  (`tokenizer.ggml.pre` "smollm": `model/pre_tokenizers.py`), or `--pre NAME`'s splits on the
  same vocabulary.

    .venv/bin/python -P benchmarks/tokenizer_speed.py --old-ref HEAD~1
    .venv/bin/python -P benchmarks/tokenizer_speed.py --old-ref HEAD~1 --only gguf --rounds 15
"""

from __future__ import annotations

import argparse
import base64
import glob
import hashlib
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine  # noqa: E402


def old_module(ref: str, path: str, name: str):
    """`path` (a module of this repository) as it was at git `ref`."""
    source = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout  # fmt: skip
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


def trained_ranks(size: int) -> Path:
    """A tiktoken file of a byte-level BPE of `size` tokens trained on this machine's Python
    sources (cached under the temp directory by size)."""
    out = Path(tempfile.gettempdir()) / f"pagoda-bench-tiktoken-{size}.model"
    if out.exists():
        return out
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
    files, total = [], 0
    for root in roots:
        for f in sorted(glob.glob(f"{root}/**/*.py", recursive=True)):
            files.append(f)
            total += os.path.getsize(f)
            if total > 200e6:
                break
    print(f"training a {size}-token BPE on {total / 1e6:.0f} MB of Python sources ...")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train(files, trainers.BpeTrainer(
        vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False, min_frequency=2))  # fmt: skip
    from pagoda.runtime.model.byte_stream import _char_bytes

    byte_of = _char_bytes()
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    lines = [base64.b64encode(bytes(byte_of[c] for c in t)) + b" %d" % i
             for i, (t, _) in enumerate(vocab)]  # fmt: skip
    out.write_bytes(b"\n".join(lines) + b"\n")
    return out


def alternate(runs: dict[str, object], rounds: int) -> dict[str, float]:
    """Median seconds of each callable, each run once a round for `rounds` rounds, in an
    order shuffled each round (seeded: the same every run)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    rng = random.Random(0)
    for _ in range(rounds):
        for name in rng.sample(list(runs), len(runs)):
            fn = runs[name]
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_tiktoken(ref: str, ranks_file: Path, rounds: int) -> None:
    from pagoda.runtime.model import tiktoken_files as new

    old = old_module(ref, "runtime/model/tiktoken_files.py", "old_tiktoken_files")
    ranks = new.read_ranks(ranks_file)
    specials = new.special_tokens(len(ranks), new.KIMI.reserved, {})
    a = old.build_tiktoken_tokenizer(ranks, new.KIMI.pattern, specials)
    b = new.build_tiktoken_tokenizer(ranks, new.KIMI.pattern, specials)
    assert a.to_str() == b.to_str(), "the two trees build different tokenizers"
    _, merges = new.merges_from_ranks(ranks)
    got = alternate({
        "before": lambda: old.build_tiktoken_tokenizer(ranks, new.KIMI.pattern, specials),
        "after": lambda: new.build_tiktoken_tokenizer(ranks, new.KIMI.pattern, specials),
    }, rounds)  # fmt: skip
    digest = hashlib.sha256(ranks_file.read_bytes()).hexdigest()[:12]
    print(f"\ntiktoken build, {len(ranks)} ranks, {len(merges)} merges ({ranks_file.name} "
          f"sha256 {digest}), median of {rounds}: before ({ref}) {got['before']:.3f} s, after "
          f"(this tree) {got['after']:.3f} s, {got['before'] / got['after']:.2f}x")  # fmt: skip


def bench_gguf(ref: str, pre: str, rounds: int) -> None:
    from pagoda.runtime.model import pre_tokenizers as new
    from pagoda.runtime.model.gguf_loader import _reader, read_config, read_tokenizer
    from pagoda.runtime.model.loader import resolve_model_path
    from tokenizers import Tokenizer

    old = old_module(ref, "runtime/model/pre_tokenizers.py", "old_pre_tokenizers")
    reader = _reader(resolve_model_path("smollm2-135m"))
    backend = read_tokenizer(reader, read_config(reader)).backend
    text = "".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))[:200_000]
    toks = {}
    for name, module in (("before", old), ("after", new)):
        toks[name] = Tokenizer.from_str(backend.to_str())
        toks[name].pre_tokenizer = module.build(module.lookup(pre))
    ids = {name: t.encode_batch([text], add_special_tokens=False)[0].ids
           for name, t in toks.items()}  # fmt: skip
    assert ids["before"] == ids["after"], "the two trees encode differently"
    got = alternate({name: (lambda t=t: t.encode_batch([text], add_special_tokens=False))
                     for name, t in toks.items()}, rounds)  # fmt: skip
    print(f"\nGGUF encode, pre-tokenizer {pre!r}, {len(text.encode()) / 1000:.0f} KB -> "
          f"{len(ids['after'])} tokens, median of {rounds}: before ({ref}) "
          f"{got['before'] * 1e3:.1f} ms, after (this tree) {got['after'] * 1e3:.1f} ms, "
          f"{got['before'] / got['after']:.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-ref", required=True, help="the git commit to compare against")
    ap.add_argument("--only", choices=("tiktoken", "gguf"))
    ap.add_argument("--ranks", type=Path, help="a tiktoken.model (default: trained here)")
    ap.add_argument("--size", type=int, default=163_584, help="trained vocabulary (Kimi K2's)")
    ap.add_argument("--pre", default="smollm", help="the GGUF pre-tokenizer name")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(machine())
    print(f"load average: {os.getloadavg()[0]:.2f}")
    if args.only in (None, "tiktoken"):
        bench_tiktoken(args.old_ref, args.ranks or trained_ranks(args.size), args.rounds)
    if args.only in (None, "gguf"):
        bench_gguf(args.old_ref, args.pre, args.rounds)
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
