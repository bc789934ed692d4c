"""Tensor parallelism on CUDA (NCCL), on a node with two GPUs or more: two ranks give one rank's
greedy tokens, with the decode steps replayed from CUDA graphs that hold the all-reduces."""

from __future__ import annotations

import pytest
import torch
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices"),
]


def test_two_gpus_give_one_gpus_tokens_through_cuda_graphs(tmp_path):
    make_tiny_model(tmp_path, "Llama", num_key_value_heads=1)  # a replicated KV head
    prompts = [[(7 * i + 3) % 290 + 5 for i in range(40 + j)] for j in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    args = dict(dtype="float32", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    with LLM(str(tmp_path), **args) as one:
        want = [
            o.outputs[0].token_ids
            for o in one.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
    with LLM(str(tmp_path), tensor_parallel_size=2, **args) as two:
        assert two.engine.runner.cuda_graphs is not None  # captured on both ranks together
        got = [
            o.outputs[0].token_ids
            for o in two.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
    assert got == want
