"""kernel_speed's ``sdpa-prefill`` rows (the non-invariant Triton backend's prompt path, torch
SDPA over the paged cache) beside the Triton kernel's, on tiny shapes under the interpreter:
a from-scratch prefill and a chunk on cached context, each agreeing with raw SDPA."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
import torch

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("the interpreter run of the prefill rows", allow_module_level=True)


@pytest.mark.parametrize("new,ctx", [(24, 24), (8, 40)], ids=["fresh", "chunk"])
def test_sdpa_prefill_rows_beside_the_triton_kernel(monkeypatch, new, ctx):
    import kernel_cases
    import kernel_speed

    def wall_us(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    monkeypatch.setattr(kernel_cases, "bench_us", wall_us)
    args = kernel_speed.parse_args(["--heads", "4", "--kv-heads", "2", "--head-dim", "32"])
    assert "sdpa-prefill" in args.prefill_paths.split(",")  # in the default rows
    args.prefill_paths = "flash-invariant,sdpa-prefill"
    rows = kernel_cases.prefill_rows(2, new, ctx, args, torch.float32, "cpu")
    label = "prefill" if new == ctx else "prefill chunk"
    assert [r.case for r in rows] == [f"{label} (flash-invariant)", f"{label} (sdpa-prefill)"]
    for r in rows:
        assert r.triton_us > 0 and r.sdpa_us > 0 and r.max_err < 1e-4
    table = kernel_speed.table(rows, peak=None).splitlines()
    assert table[3].startswith(f"| {label} (sdpa-prefill) | 2 | {new} | {ctx} |")
