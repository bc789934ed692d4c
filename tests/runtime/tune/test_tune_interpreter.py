"""`pagoda tune` with the Triton backend under the interpreter: the kernel stage end to end.

There is no GPU here, so this is how the CUDA orchestration is exercised: buckets from the
model's shapes (a tiny Qwen3-MoE: its matmul, expert and attention shapes), candidates checked
against the reference, winners saved bucket by bucket into the profile folder, the engine profile
built with those configs, and a resume that sweeps nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest
from hf_oracle import make_tiny_llama

pytest.importorskip("triton")

from pagoda.kernels import fused_moe
from pagoda.runtime.tune import engine, moe, sweep
from pagoda.runtime.tune.choose import Targets
from pagoda.runtime.tune.kernel_stage import INTERPRETER_LABEL
from pagoda.runtime.tune.runner import TuneRequest, tune

if os.environ["TRITON_INTERPRET"] != "1":
    pytest.skip("the interpreter path of the kernel stage", allow_module_level=True)


def _one_call_ms(fn, repeats: int = 1) -> float:
    """`sweep.wall_timer`'s milliseconds, of one call."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


@pytest.mark.slow
def test_kernel_stage_through_the_interpreter(tmp_path, monkeypatch, capsys):
    """`pagoda tune` end to end on a tiny Qwen3-MoE checkpoint: the expert shape read from its
    config.json, its bucket swept (two candidates) and saved beside the dense buckets."""
    make_tiny_llama(
        tmp_path / "m", arch="Qwen3Moe", head_dim=16, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True,
    )  # fmt: skip
    # one timed call per candidate, no warm-up (the default: a warm-up and three; a candidate
    # has run once already, checked against the reference): interpreter timings only have to
    # pick a winner here (`wall_timer` itself: test_kernel_sweep, test_moe_sweep)
    monkeypatch.setattr(sweep, "wall_timer", _one_call_ms)
    # one decode point, not --quick's four, of one timed step, not three: each step runs the
    # model under the interpreter (41% of the test's time with four points); the batch of 4
    # keeps the kernel stage's max_num_seqs (test_tune_e2e measures --quick's whole plan)
    quick_plan = engine.make_plan(max_model_len=128, cuda=False, quick=True)
    plan = dataclasses.replace(
        quick_plan, decode_batches=(4,), decode_contexts=(32,), decode_steps=1
    )
    monkeypatch.setattr(engine, "make_plan", lambda **kw: plan)
    request = TuneRequest(
        model=str(tmp_path / "m"),
        output=str(tmp_path / "profile"),
        engine_args={"dtype": "float32", "attention_backend": "triton", "kv_cache_memory": 4 << 20},
        max_model_len=128,
        targets=Targets(ttft_s=60, itl_s=10),
        quick=True,
        progress=False,
    )
    result = tune(request)
    assert result.usable and result.profile["complete"]
    kernels = result.profile["kernels"]
    assert kernels["status"] == "tuned" and kernels["config_file"] == f"{INTERPRETER_LABEL}.json"
    assert [b["kernel"] for b in kernels["buckets"]] == [
        "matmul",  # batch-invariant matmuls (the default): one bucket per weight shape, first
        moe.FUSED_MOE,  # then the experts' GEMMs, at the batch-invariant token bucket
        "prefill_attention",  # batch-invariant attention: every row in the prefill kernel,
        "prefill_attention",  # its decode launch's bucket, then its prefill launch's
    ]
    (b,) = [b for b in kernels["buckets"] if b["kernel"] == moe.FUSED_MOE]
    assert b["shape"] == {"experts": 8, "intermediate": 32, "hidden": 64, "itemsize": 4,
                          "tokens": fused_moe.INVARIANT_TOKENS}  # fmt: skip
    assert all(
        b["config"] and b["rejected"] == [] and b["candidates"] >= 2 for b in kernels["buckets"]
    )
    saved = json.loads((tmp_path / "profile" / kernels["config_file"]).read_text())
    for kernel in {b["kernel"] for b in kernels["buckets"]}:
        assert saved["kernels"][kernel] == [
            {"shape": b["shape"], "config": b["config"]}
            for b in kernels["buckets"]
            if b["kernel"] == kernel
        ]
    assert "kernels: CPU under TRITON_INTERPRET=1" in capsys.readouterr().err
    assert [(p["batch"], p["context"]) for p in result.profile["engine"]["decode"]] == [(4, 32)]
    assert result.profile["attention_backend"] == "triton"

    swept = []
    monkeypatch.setattr(sweep, "sweep_bucket", lambda *a, **k: swept.append(a))
    monkeypatch.setattr(sweep, "sweep_matmul_bucket", lambda *a, **k: swept.append(a))
    monkeypatch.setattr(moe, "sweep_moe_bucket", lambda *a, **k: swept.append(a))
    again = tune(request)
    assert swept == [] and again.profile["kernels"]["buckets"] == kernels["buckets"]
    assert again.profile["engine"] == result.profile["engine"]
