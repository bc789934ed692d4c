"""EXAONE MoE (`ExaoneMoeForCausalLM`: K-EXAONE) against transformers, token for token and
logits within 1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts
chunked into 16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small
enough to preempt.

- exaone-moe: per-head q/k norms, hybrid attention (every second layer global and without
  rotary, the others in a window shorter than the prompts), a dense first layer, then V3's
  router (sigmoid, a correction bias large enough to change the picks, 4 groups of which 2,
  renormalised, scaled by 2.5) beside a shared expert;
- exaone-moe-types: `layer_types` given (one rotating window layer between two NoPE global
  ones, the window the default 4096), dense layers by `mlp_layer_types`, one group, not
  renormalised, two shared experts.

Also: the config as transformers reads it, the weights estimate against what the built model
holds, and two tensor-parallel ranks (gloo).
"""

from __future__ import annotations

import pytest
import torch
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
FULL = "full_attention"
CASES = {
    "exaone-moe": dict(
        head_dim=32, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, num_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, num_hidden_layers=4,
        sliding_window=11, sliding_window_pattern=2, eos_token_id=2),
    "exaone-moe-types": dict(
        head_dim=16, num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
        routed_scaling_factor=1.0, num_shared_experts=2, moe_intermediate_size=24,
        num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"],
        layer_types=[FULL, "sliding_attention", FULL], eos_token_id=2),
}  # fmt: skip


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), with random
    correction biases on its expert layers; returns the model."""
    model = make_tiny_model(path, "ExaoneMoe", **CASES[name])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_reads_as_transformers(built):
    path, _, _, _ = built("exaone-moe")
    f = read_model_config(str(path)).family
    assert f.qk_norm and f.sliding_window == 11
    assert f.window_layers == f.rope_layers == (True, False, True, False)
    assert f.moe_layers == (False, True, True, True) and f.routing.bias
    g = read_model_config(str(built("exaone-moe-types")[0])).family
    assert g.sliding_window == 4096 and g.rope_layers == (False, True, False)
    assert g.moe_layers == (True, False, True)
    assert g.shared_expert_intermediate_size == 48


def test_a_pattern_string_beside_layer_types_reads_as_transformers(built, tmp_path):
    """EXAONE's own configs name the pattern "LLLG" beside `layer_types`: transformers reads
    the list (and never the string); so does the engine (it raised a TypeError)."""
    import json

    cfg = json.loads((built("exaone-moe-types")[0] / "config.json").read_text())
    cfg["sliding_window_pattern"] = "LLLG"
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).layer_types
    f = read_model_config(str(tmp_path)).family
    assert f.window_layers == tuple(t == "sliding_attention" for t in theirs) == (
        False, True, False)  # fmt: skip


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    from model_bytes import check_estimate

    path, _, _, _ = built("exaone-moe")
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("exaone-moe")
    check_two_ranks(path, loaded, reference, "exaone-moe", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    moe = runner.model.layers[-1].mlp
    assert getattr(moe, "routed", moe).fused is not None
