"""Smoke run of the int8-vs-auto KV cache benchmark: every table is printed and sane."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pagoda.runtime.config import cpu_has_fast_bf16

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _rows(out: str, first: str) -> list[list[str]]:
    lines = [ln for ln in out.splitlines() if ln.startswith(f"| {first}")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


@pytest.mark.slow
def test_accuracy_capacity_and_speed_tables(capsys):
    import kv_cache_dtype

    argv = ["--cases", "3x40", "--text-tokens", "120", "--blocks", "2", "--block-steps", "2"]
    argv += ["--prefill", "2x64"]
    assert kv_cache_dtype.main(argv) == 0
    out = capsys.readouterr().out
    model = "bf16" if cpu_has_fast_bf16() else "float32"  # dtype auto on this CPU
    (auto,), (int8,) = _rows(out, f"{model} model, {model}"), _rows(out, f"{model} model, int8")
    if model == "bf16":
        assert 0 < float(auto[1]) < 0.05  # mean KL vs float32
    else:
        assert float(auto[1]) == 0 and float(auto[3]) == 1  # it is the float32 reference
    assert 0 < float(int8[1]) < 0.05
    assert float(int8[3]) > 0.85  # top-1 agreement
    (auto_cap,), (int8_cap,) = _rows(out, "auto"), _rows(out, "int8")
    assert int(int8_cap[1]) < int(auto_cap[1])  # bytes per token
    assert int(int8_cap[2].replace(",", "")) > int(auto_cap[2].replace(",", ""))
    (pre,) = _rows(out, "2 | 64")
    assert float(pre[2]) > 0 and float(pre[3]) > 0 and pre[4].endswith("x")
    (speed,) = _rows(out, "3 | 40")
    assert float(speed[2]) > 0 and float(speed[3]) > 0 and speed[6].endswith("x")
