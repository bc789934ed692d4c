"""The offline benchmark's memory-traffic count: weights once a step, each sequence's context."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_count_reads_counts_weights_once_a_step_and_each_context():
    import offline_throughput
    import torch
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.cpu import qgemm
    from pagoda.runtime.model.loader import load_model

    llm = LLM(loaded=load_model("smollm2-135m"), enable_prefix_caching=False)
    reads = offline_throughput.count_reads(llm)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(100, 120))}], params)
    runner = llm.engine.runner
    mc = runner.model_config
    elem = torch.empty((), dtype=runner.dtype).element_size()
    weights = offline_throughput.streamed_weight_bytes(runner.model)
    linears = runner.model.linears()
    if all(isinstance(x.fast, qgemm.QGemmWeight) for x in linears):  # float32 CPU: GGUF blocks
        assert weights == sum(x.fast.nbytes for x in linears)
        assert 90e6 < weights < 100e6  # Q4_1 layers and a Q8_0 head: 96 MB, not 538
    else:
        # every parameter but the RMSNorm weights (two per layer and the final one); SmolLM2
        # ties its embeddings to the LM head, so the table is counted once, as the head
        norms = (2 * mc.num_layers + 1) * mc.hidden_size
        assert weights == (mc.num_params - norms) * elem
    kv_token = runner.bytes_per_block // runner.block_size
    # one prefill step over 20 tokens, then decodes over contexts of 21 and 22
    assert reads["steps"] == 3
    assert reads["bytes"] == 3 * weights + (20 + 21 + 22) * kv_token
    assert kv_token == mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * elem
