"""What a tuned profile's kernel cache weighs and costs, measured without a GPU.

The attention variants serving's warm-up launches (`engine/warmup.py`: `kernel_cases` and
`run_kernel_case`, at the Llama-3.2-1B shape and the engine's default knobs) are compiled here
for sm_90 (an H100/H200): Triton's wheel brings ptxas, and a compile-only driver makes each
launch a `warmup=True` compile. The kernel configs are the packaged H200 file's, with the
H200's 132 SMs for the split rule. Then, as the tuning Job and a pod would:

1. compile every variant into an empty ``TRITON_CACHE_DIR`` (a fresh process: what a pod pays);
2. pack that folder (`kernel_cache.pack`): the archive's size, and the ConfigMap budget;
3. install it into another empty folder (`kernel_cache.install`) and run the same launches in a
   fresh process there: every one a cache hit, nothing written.

The times are this CPU's compile and load times, not a GPU's warm-up (no module load on a GPU,
no engine steps, no other kernels): the GPU check's `kcache` step measures start to ready.

    .venv/bin/python -P benchmarks/kernel_cache_cpu.py             # both attention modes
    .venv/bin/python -P benchmarks/kernel_cache_cpu.py --modes invariant
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
MODES = {"invariant": True, "default-kernels": False}  # --batch-invariant on (the default) / off


def launches(mode: str, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int):
    """The warm-up's attention launches in this process, compile-only for sm_90; (launches,
    cases, seconds)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class CompileOnlySm90:  # what JITFunction.run asks the driver before it launches
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    driver.set_active(CompileOnlySm90())
    JITFunction.__getitem__ = lambda self, grid: (
        lambda *a, **k: self.run(*a, grid=grid, warmup=True, **k)
    )
    from pagoda.kernels import attention
    from pagoda.kernels import config as kcfg

    kcfg.device_name = lambda device=None: "NVIDIA H200"
    kcfg.num_sms = attention.num_sms = lambda device=None: 132
    attention.check_device = lambda *tensors: tensors[0].device  # CPU tensors, never launched
    from pagoda.runtime.engine.warmup import Geometry, kernel_cases, run_kernel_case

    geo = Geometry(32, 8, 64, 16, torch.bfloat16, torch.device("cpu"))  # Llama-3.2-1B
    invariant = MODES[mode]
    cases = kernel_cases(
        geo, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, batch_invariant=invariant,
    )  # fmt: skip
    start = time.perf_counter()
    n = sum(run_kernel_case(geo, *case, batch_invariant=invariant) for case in cases)
    return n, len(cases), time.perf_counter() - start


def child(args: argparse.Namespace) -> None:
    n, cases, seconds = launches(args.mode, args.max_model_len, args.max_num_seqs, args.batched)
    print(json.dumps({"launches": n, "cases": cases, "seconds": seconds}))


def run_child(args: argparse.Namespace, mode: str, cache: Path) -> dict:
    cmd = [sys.executable, "-P", __file__, "--child", "--mode", mode,
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--batched", str(args.batched)]  # fmt: skip
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TRITON_INTERPRET": "0"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def files(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_size for p in cache.rglob("*") if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    ap.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-model-len", type=int, default=4096)  # the 1B shape's context
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--batched", type=int, default=2048, help="max_num_batched_tokens")
    args = ap.parse_args()
    if args.child:
        return child(args)
    import triton
    from common import machine
    from pagoda.runtime.kernel_cache import Identity, install, pack, pagoda_version
    from pagoda.runtime.tuned_profile import MAX_BYTES

    print(
        f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}; triton {triton.__version__}"
    )
    identity = Identity(triton.__version__, "cuda:90", pagoda_version())
    rows = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            built, pod = Path(tmp) / "built", Path(tmp) / "pod"
            cold = run_child(args, mode, built)
            packed = pack(built, Path(tmp) / "triton-cache.tar.xz", identity)
            start = time.perf_counter()
            done = install(packed.path, pod, identity, packed.sha256)
            installed_s = time.perf_counter() - start
            before = files(pod)
            warm = run_child(args, mode, pod)
            assert files(pod) == before, "a launch compiled after the install"
            raw = sum(files(built).values())
            rows.append([
                mode, f"{cold['cases']}", f"{cold['launches']}", f"{packed.kernels}",
                f"{raw / 1024:.0f}", f"{packed.unpacked_bytes / 1024:.0f}",
                f"{packed.bytes / 1024:.0f}", f"{4 * packed.bytes / 3 / MAX_BYTES:.0%}",
                f"{installed_s * 1000:.0f}", f"{cold['seconds']:.1f}", f"{warm['seconds']:.2f}",
            ])  # fmt: skip
            print(f"  {mode}: {done.describe()}", flush=True)
    head = ["attention", "cases", "launches", "kernels", "cache KiB", "shipped KiB",
            "archive KiB (xz)", "of a ConfigMap (base64)", "install ms", "compile s (cold)",
            "launches s (installed)"]  # fmt: skip
    from common import markdown_table

    print(markdown_table(head, rows))


if __name__ == "__main__":
    main()
