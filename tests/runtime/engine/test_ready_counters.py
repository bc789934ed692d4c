"""The engine's cumulative counters (`/metrics`: prefix-cache queries and hits, preemptions)
count clients' requests only: the warm-up before /ready is not traffic."""

from __future__ import annotations

from hf_oracle import make_tiny_llama
from pagoda.runtime.config import EngineConfig
from pagoda.runtime.engine.core_proc import first_step
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.server.launch import build_core


def test_counters_start_at_zero_when_ready(tmp_path):
    make_tiny_llama(tmp_path)
    cfg = EngineConfig.create(
        str(tmp_path), dtype="float32", kv_cache_memory=4 << 20, max_model_len=128, max_num_seqs=4
    )
    core = build_core(cfg)  # loads and warms up, as `pagoda serve` does
    first_step(core)  # the last step before ready
    s = core.stats()
    assert (s.prefix_queries, s.prefix_hits, s.num_preemptions) == (0, 0, 0)
    assert s.num_running == s.num_waiting == 0 and s.num_free_blocks == s.num_blocks
    ids = core.tokenizer.encode("the cat sat on the mat")
    core.add_request("r", ids, SamplingParams(max_tokens=2))
    while core.has_unfinished_requests():
        core.step()
    assert core.stats().prefix_queries == len(ids)
