"""EngineCore.enable_step_clock: every phase of a sampling step is timed, once per step."""

from __future__ import annotations

from hf_oracle import make_tiny_llama
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.model.loader import load_model

PHASES = {"schedule", "prepare", "forward", "sample", "readback", "update", "detokenize", "outputs"}


def test_clock_times_every_phase_of_every_step(tmp_path):
    make_tiny_llama(tmp_path)
    llm = LLM(loaded=load_model(str(tmp_path)), dtype="float32", kv_cache_memory=1 << 22)
    clock = llm.engine.enable_step_clock()
    params = SamplingParams(temperature=0.8, max_tokens=5, ignore_eos=True)
    out = llm.generate([[5, 6, 7], [8, 9]], params)
    assert [len(o.outputs[0].token_ids) for o in out] == [5, 5]
    assert set(clock.totals) == PHASES
    assert clock.steps == 5  # one prefill step, then four decodes
    per_step = clock.per_step_ms()
    assert all(v >= 0 for v in per_step.values()) and per_step["forward"] > 0
    clock.reset()
    assert clock.steps == 0 and not clock.totals
