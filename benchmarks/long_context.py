"""Long-context case of the offline benchmark: one prompt of N tokens, then single-stream decode.

Decode speed at long context is dominated by reading the sequence's K/V every step (the weights
are read once per step whatever the context). Pagoda's number is the decode rate after the prompt
is in the cache (the second request for the same prompt recomputes only its last partial block);
HF `generate` (bf16, or float32 on a CPU without native bf16; its KV cache grown in place) is the
baseline, measured the same way: the time for `out_len + 1` new tokens minus the time for one.

Run as a script, it compares Pagoda's CPU attention paths side by side, each in its own process,
in interleaved rounds (the machine drifts): the C++ kernel, the torch gather path
(``PAGODA_CPU_ATTENTION=torch``), the kernel over an int8 K/V cache (``--kv-cache-dtype int8``),
where the AMX GEMM, the decode GEMV or the quantized GEMM is on by default the kernel with
oneDNN's matmuls instead (``PAGODA_CPU_AMX_GEMM=0 PAGODA_CPU_GEMV=0 PAGODA_CPU_QGEMM=0``) and,
with ``--old-ref``, the runtime of an older commit::

    .venv/bin/python -P benchmarks/long_context.py --ctx 5000 --old-ref 37e8f81 [--hf]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `pagoda serve`; before torch loads OpenMP

import torch
from pagoda.runtime import LLM, SamplingParams


def pagoda_long_context(
    loaded, ids: list[int], ctx: int, out_len: int, dtype: str, kv_cache_dtype: str = "auto"
) -> dict:
    llm = LLM(
        loaded=loaded,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=ctx + out_len + 16,
        max_num_seqs=4,
    )
    prompt = {"prompt_token_ids": ids[:ctx]}
    t = time.perf_counter()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1))
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True))
    decode = time.perf_counter() - t
    return {
        "system": f"pagoda ({dtype}, K/V {kv_cache_dtype}), {ctx}-token context",
        "prefill_s": prefill,
        "decode_tok_s": out_len / decode,
    }


def hf_long_context(path: str, ids: list[int], ctx: int, out_len: int) -> dict:
    import transformers
    from pagoda.runtime.config import cpu_has_fast_bf16

    dtype = torch.bfloat16 if cpu_has_fast_bf16() else torch.float32  # HF's faster one here
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype
    ).eval()
    x = torch.tensor([ids[:ctx]])

    def run(n: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=x, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - t

    one = run(1)
    many = run(out_len + 1)
    return {
        "system": f"HF generate ({str(dtype)[6:]}), {ctx}-token context",
        "prefill_s": one,
        "decode_tok_s": out_len / max(1e-9, many - one),
    }


def long_context_ids(tokenizer, ctx: int) -> list[int]:
    """Real text (this repository's docs), repeated to `ctx` tokens."""
    root = Path(__file__).resolve().parent.parent
    text = "".join(
        (root / p).read_text(encoding="utf-8")
        for p in ("README.md", "docs/runtime.md", "docs/operator.md")
    )
    ids = tokenizer.encode(text)
    while len(ids) < ctx:
        ids = ids + ids
    return ids[:ctx]


def _child(args) -> None:
    """One measurement in this process; prints a JSON line."""
    import pagoda.runtime
    from pagoda.runtime.model.loader import load_model

    torch.set_num_threads(args.threads or torch.get_num_threads())
    loaded = load_model("smollm2-135m")
    ids = long_context_ids(loaded.tokenizer, args.ctx)
    if args.child == "hf":
        row = hf_long_context(loaded.path, ids, args.ctx, args.out_len)
    else:  # "pagoda" or "pagoda-int8" (an int8 K/V cache)
        kv = "int8" if args.child.endswith("int8") else "auto"
        row = pagoda_long_context(loaded, ids, args.ctx, args.out_len, "auto", kv)
    row["runtime"] = str(Path(pagoda.runtime.__file__).resolve().parent)
    print("RESULT " + json.dumps(row), flush=True)


def _old_tree(ref: str, into: Path) -> Path:
    """`ref`'s runtime as an importable `pagoda` package under `into` (for PYTHONPATH)."""
    root = Path(__file__).resolve().parent.parent
    src = into / "src"
    src.mkdir()
    tar = subprocess.run(
        ["git", "-C", str(root), "archive", ref, "runtime", "kernels", "operator"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    pkg = into / "pkg" / "pagoda"
    pkg.mkdir(parents=True)
    for name in ("runtime", "kernels", "operator"):
        (pkg / name).symlink_to(src / name)
    return pkg.parent


def library_at(ref: str, code: str) -> Path:
    """A native library as git revision `ref` builds it (its sources, flags and build code):
    `code` runs in `ref`'s runtime, in a fresh process, and prints the library's path (in the
    shared build cache, so it outlives the extracted tree)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(_old_tree(ref, Path(tmp))))
        cmd = [sys.executable, "-P", "-c", code]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if res.returncode or not Path(path).is_file():
        raise RuntimeError(f"building the library of {ref} failed:\n{res.stderr[-2000:]}")
    return Path(path)


def _run(variant: str, env: dict, args) -> dict:
    cmd = [sys.executable, "-P", __file__, "--child", variant, "--ctx", str(args.ctx)]
    cmd += ["--out-len", str(args.out_len), "--threads", str(args.threads)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode or not lines:
        raise RuntimeError(f"{variant} failed:\n{res.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _child_kind(variant: str) -> str:
    if variant == "hf":
        return "hf"
    return "pagoda-int8" if "int8" in variant else "pagoda"


def print_table(runs: dict[str, list[dict]], args) -> None:
    """Per variant: best prefill, decode rate per round, mean and the first variant's ratio."""
    from common import markdown_table

    ref = next(iter(runs))
    mean = {n: sum(x["decode_tok_s"] for x in rs) / len(rs) for n, rs in runs.items()}
    table = [
        [
            n,
            f"{min(x['prefill_s'] for x in rs):.1f}",
            " / ".join(f"{x['decode_tok_s']:.1f}" for x in rs),
            f"{mean[n]:.1f}",
            f"{mean[ref] / mean[n]:.2f}x",
        ]
        for n, rs in runs.items()
    ]
    print()
    print(f"{args.ctx}-token context, {args.out_len} tokens decoded, dtype auto, single stream")
    heads = ["variant", "prefill s (best)", "decode tok/s per round", "mean", f"{ref} is"]
    print(markdown_table(heads, table))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ctx", type=int, default=5000)
    ap.add_argument("--out-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--old-ref", help="also run the runtime of this git commit")
    ap.add_argument("--hf", action="store_true", help="also run HF generate")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return 0
    from common import machine

    # this tree's modules (an --old-ref child may import an older tree without them)
    from pagoda.runtime.cpu import amx_gemm, gemv, qgemm
    from pagoda.runtime.model.linear import _pack

    print(f"machine: {machine()}", flush=True)
    skip = ("PYTHONPATH", "PAGODA_CPU_ATTENTION", gemv.ENV_SWITCH, amx_gemm.ENV_SWITCH)
    skip += (qgemm.ENV_SWITCH,)
    base = {k: v for k, v in os.environ.items() if k not in skip}
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "kernel": dict(base, PAGODA_CPU_ATTENTION="kernel"),
            "torch gather path": dict(base, PAGODA_CPU_ATTENTION="torch"),
        }
        if gemv.wanted() or amx_gemm.load(_pack) is not None or qgemm.load() is not None:
            off = {gemv.ENV_SWITCH: "0", amx_gemm.ENV_SWITCH: "0", qgemm.ENV_SWITCH: "0"}
            variants["kernel, oneDNN matmuls"] = dict(variants["kernel"], **off)
        variants["kernel, int8 K/V cache"] = variants["kernel"]
        if args.old_ref:
            variants[f"old ({args.old_ref})"] = dict(
                base, PYTHONPATH=str(_old_tree(args.old_ref, Path(tmp)))
            )
        if args.hf:
            variants["hf"] = base
        runs: dict[str, list[dict]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name, env in variants.items():
                row = _run(_child_kind(name), env, args)
                runs[name].append(row)
                print(f"round {r + 1} {name}: {row}", flush=True)
    print_table(runs, args)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
