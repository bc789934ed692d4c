"""dots.llm1 (`Dots1ForCausalLM`) against transformers, token for token and logits within 1e-3
(float32), on tiny random checkpoints transformers writes itself: prompts chunked into 16-token
steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to preempt.

- dots1: per-head q/k norms, a dense first layer, then V3's router (sigmoid, a correction bias
  large enough to change the picks, 4 groups of which 2, renormalised, scaled by 2) and one
  shared expert; a sliding window on the layers from `max_window_layers` on (prompts longer
  than it);
- dots1-flat: one group, not renormalised, two shared experts, experts from the first layer on,
  q/k/v biases, no window (`sliding_window: null`).

Also: the config as transformers reads it, the weights estimate against what the built model
holds, and two tensor-parallel ranks (gloo).
"""

from __future__ import annotations

import json

import pytest
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_on_cuda_with_graphs,
    check_preempted,
    check_two_ranks,
    scramble_correction_biases,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "dots1": dict(
        head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        routed_scaling_factor=2.0, norm_topk_prob=True, n_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, num_hidden_layers=3,
        sliding_window=11, max_window_layers=1),
    "dots1-flat": dict(
        head_dim=16, n_routed_experts=6, num_experts_per_tok=3, n_group=1, topk_group=1,
        routed_scaling_factor=1.5, norm_topk_prob=False, n_shared_experts=2,
        moe_intermediate_size=24, first_k_dense_replace=0, attention_bias=True,
        sliding_window=None),
}  # fmt: skip


def write_case(name: str, path):
    overrides = CASES[name]
    model = make_tiny_model(path, "Dots1", **overrides)
    scramble_correction_biases(model, path, overrides["first_k_dense_replace"])
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_reads_as_transformers(built, tmp_path):
    """The window on transformers' layer_types, and a config without layer_types (the released
    ones: `sliding_window` null, or set with `max_window_layers`) read as Dots1Config does."""
    path, _, _, _ = built("dots1")
    c = read_model_config(str(path))
    f = c.family
    assert c.architecture == "dots1" and f.qk_norm and c.rope_scaling is None
    assert f.sliding_window == 11 and f.window_layers == (False, True, True)
    assert f.moe_layers == (False, True, True) and f.shared_expert_intermediate_size == 32
    r = f.routing
    assert (r.scoring, r.topk_method, r.n_group, r.topk_group) == ("sigmoid", "noaux_tc", 4, 2)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["layer_types"]
    for window, layers in ((None, 1), (7, 2), (7, 5)):
        cfg.update(sliding_window=window, max_window_layers=layers)
        (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone
        theirs = transformers.AutoConfig.from_pretrained(tmp_path).layer_types
        ours = read_model_config(str(tmp_path)).family
        want = tuple(t == "sliding_attention" for t in theirs)
        assert tuple(ours.window(i) is not None for i in range(3)) == want
        assert ours.sliding_window == (window if any(want) else None)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    from model_bytes import check_estimate

    path, _, _, _ = built("dots1")
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("dots1")
    check_two_ranks(path, loaded, reference, "dots1", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    moe = runner.model.layers[-1].mlp
    assert getattr(moe, "routed", moe).fused is not None
