"""Greedy output must match Hugging Face transformers on the same GGUF, token for token.

Seven prompts of 1 to 1,100 tokens run together in one batch (so decodes, prefill chunks and
prefix hits mix in the same steps), once with chunked prefill and prefix caching on and once
with both off. Per-step logits must agree within 1e-3.
"""

from __future__ import annotations

import pytest
import torch
from hf_oracle import hf_greedy
from pagoda.runtime import LLM, SamplingParams

# 1 token, a block (16) and one past it, prompts over one 512-token chunk (640) and over two
# (1,100: the long context, three chunks of which the last ends mid-block). Each prompt adds its
# transformers reference to the module's setup, and prefill grows faster than the length:
# 1,500 tokens (also three chunks; its decodes' keys, like 1,100's, span three of the CPU
# kernel's 32-block score tasks, `attention.cpp`'s `run`) cost ~9 s of the references' 20 s
LENGTHS = [1, 16, 17, 95, 310, 640, 1100]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def prompts(corpus_ids) -> list[list[int]]:
    # Even-indexed prompts share the corpus prefix (prefix-cache hits); odd ones start elsewhere.
    return [corpus_ids[(i % 2) * 41 : (i % 2) * 41 + n] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference(hf_model, prompts):
    return [hf_greedy(hf_model, p, NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize(
    "engine_args",
    [
        dict(enable_chunked_prefill=True, enable_prefix_caching=True, max_num_batched_tokens=512),
        dict(
            enable_chunked_prefill=False, enable_prefix_caching=False, max_num_batched_tokens=2048
        ),
    ],
    ids=["chunked+prefix", "plain"],
)
@pytest.mark.slow
def test_greedy_matches_transformers(smol, prompts, reference, engine_args):
    llm = LLM(
        loaded=smol, dtype="float32", max_model_len=2048, kv_cache_memory=320 << 20, **engine_args
    )
    seen: dict[str, list[torch.Tensor]] = {}

    def observe(reqs, logits):
        for r, row in zip(reqs, logits.float()):
            seen.setdefault(r.request_id, []).append(row.clone())

    llm.engine.runner.logits_hook = observe
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for out, (ref_tokens, ref_logits), n in zip(outs, reference, LENGTHS):
        assert out.outputs[0].token_ids == ref_tokens, f"prompt of {n} tokens diverged"
        ours = seen[out.request_id]
        assert len(ours) == NEW_TOKENS
        worst = max(float((a - b).abs().max()) for a, b in zip(ours, ref_logits))
        assert worst < 1e-3, f"prompt of {n} tokens: logits differ by {worst}"
    if engine_args["enable_prefix_caching"]:
        assert llm.engine.kv.prefix_hits > 0
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.pool.num_blocks
