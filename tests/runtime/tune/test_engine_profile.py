"""Engine profile on a real (tiny, random) engine: points, resumption, out-of-time behaviour."""

from __future__ import annotations

import pytest
from hf_oracle import make_tiny_llama
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.core import EngineCore
from pagoda.runtime.model.loader import load_model
from pagoda.runtime.tune.engine import EnginePlan, EngineProfiler, make_plan, measure_engine

PLAN = EnginePlan((16, 200), (1, 3), (24, 40), decode_steps=2, prefill_repeats=2)


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> EngineCore:
    path = tmp_path_factory.mktemp("tiny")
    make_tiny_llama(path)
    args = dict(dtype="float32", kv_cache_memory=4 << 20, max_model_len=128, max_num_seqs=4)
    return EngineCore(
        EngineConfig.create(str(path), max_num_batched_tokens=256, **args), load_model(str(path))
    )


def test_every_point_is_measured_and_the_engine_left_clean(core):
    built, labels = [], []

    def make() -> EngineProfiler:
        built.append(1)
        return EngineProfiler(core)

    section = measure_engine(make, PLAN, None, deadline=float("inf"), progress=labels.append)
    assert built == [1] and section["complete"] and section["skipped"] == []
    assert [p["chunk_tokens"] for p in section["prefill"]] == [16, 200]  # 200 = two prompts
    assert [(p["batch"], p["context"]) for p in section["decode"]] == [
        (1, 24),
        (3, 24),
        (1, 40),
        (3, 40),
    ]
    for p in section["prefill"]:
        assert p["tokens_per_s"] == pytest.approx(p["chunk_tokens"] / p["step_s"], rel=1e-2)
    kv = section["kv_cache"]
    assert kv["capacity_tokens"] == core.kv.pool.num_blocks * 16 and kv["bytes_per_token"] > 0
    assert labels == [
        "prefill 16",
        "prefill 200",
        "decode 1x24",
        "decode 3x24",
        "decode 1x40",
        "decode 3x40",
    ]
    assert not core.has_unfinished_requests()


def test_resume_measures_only_what_is_missing(core):
    first = measure_engine(lambda: EngineProfiler(core), PLAN, None, deadline=float("inf"))
    partial = {**first, "decode": first["decode"][:-1]}
    labels: list[str] = []
    again = measure_engine(
        lambda: EngineProfiler(core), PLAN, partial, deadline=float("inf"), progress=labels.append
    )
    assert again["prefill"] == first["prefill"] and again["decode"][:-1] == first["decode"][:-1]
    assert (again["decode"][-1]["batch"], again["decode"][-1]["context"]) == (3, 40)
    assert [lab for lab in labels if not lab.endswith("(kept)")] == ["decode 3x40"]


def test_out_of_time_builds_no_engine_and_marks_incomplete():
    def make() -> EngineProfiler:
        raise AssertionError("nothing should be measured")

    section = measure_engine(make, PLAN, None, deadline=0.0)
    assert not section["complete"] and section["prefill"] == [] and section["decode"] == []


def test_points_that_do_not_fit_are_skipped(core):
    plan = EnginePlan((16,), (8,), (24,), decode_steps=2, prefill_repeats=1)  # 8 > max_num_seqs
    section = measure_engine(lambda: EngineProfiler(core), plan, None, deadline=float("inf"))
    assert section["skipped"] == ["decode 8x24"] and section["decode"] == []


def test_plans_fit_the_context():
    plan = make_plan(max_model_len=64, cuda=False, quick=False)
    assert max(plan.decode_contexts) + plan.decode_steps + 16 < 64
    assert make_plan(max_model_len=4096, cuda=True, quick=False).num_points > plan.num_points
    with pytest.raises(ValueError, match="chunk_sizes"):
        EnginePlan((), (1,), (8,))


def test_points_read_their_own_steps_outputs_as_on_cuda(core):
    """On CUDA an engine emits a step's outputs during the next step; the profiler turns that
    off, since each point reads the outputs of the step it timed (an async engine is refused)."""
    core.overlap_outputs = True  # what EngineCore sets on CUDA
    try:
        profiler = EngineProfiler(core)
        assert profiler.prefill_point(16, 1)["chunk_tokens"] == 16
        assert profiler.decode_point(2, 24, 2)["batch"] == 2
    finally:
        core.overlap_outputs = False
    assert not core.has_unfinished_requests()
    core.async_scheduling = True
    try:
        with pytest.raises(ValueError, match="synchronous"):
            EngineProfiler(core)
    finally:
        core.async_scheduling = False


def test_the_tuning_engine_times_whole_chunks():
    """A prefill point split over several prompts must be one step of all its tokens: the
    long-prefill cap (256 on CPU by default) would cut each prompt's share."""
    from pagoda.runtime.tune.engine import make_plan
    from pagoda.runtime.tune.runner import TuneRequest, _engine_config

    plan = make_plan(max_model_len=300, cuda=False, quick=False)  # 512-token chunks: 2 prompts
    cfg = _engine_config(TuneRequest("smollm2-135m", "/tmp/x"), plan, 300).with_device_defaults()
    assert cfg.scheduler.long_prefill_token_threshold == 0
    assert cfg.scheduler.max_num_batched_tokens >= max(plan.chunk_sizes)
