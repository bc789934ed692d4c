"""FlexOlmo (`FlexOlmoForCausalLM`) against transformers, token for token and logits within
1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked into
16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to
preempt. OLMo 2's layer (norms after, whole-projection q/k norms) with OLMoE's experts:

- flex-olmo: top-2 of 4, not renormalised (FlexOlmoConfig's default);
- flex-olmo-norm: top-3 of 6, renormalised, three layers.

Also: the weights estimate against what the built model holds, and two tensor-parallel ranks
(gloo: the q/k norms' sums all-reduced).
"""

from __future__ import annotations

import pytest
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_on_cuda_with_graphs,
    check_preempted,
    check_two_ranks,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
IDS = dict(pad_token_id=0, eos_token_id=2)
CASES = {
    "flex-olmo": dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32, **IDS),
    "flex-olmo-norm": dict(num_experts=6, num_experts_per_tok=3, intermediate_size=24,
                           norm_topk_prob=True, num_hidden_layers=3, **IDS),
}  # fmt: skip


def write_case(name: str, path):
    return make_tiny_model(path, "FlexOlmo", **CASES[name])


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    from model_bytes import check_estimate

    path, _, _, _ = built("flex-olmo-norm")
    f = read_model_config(str(path)).family
    assert f.olmo2_norms and f.qk_norm_whole and f.norm_topk_prob and f.num_experts == 6
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("flex-olmo")
    check_two_ranks(path, loaded, reference, "flex-olmo", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    assert runner.model.layers[-1].mlp.fused is not None
