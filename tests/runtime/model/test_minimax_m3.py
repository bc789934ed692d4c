"""MiniMax-M3's text model (`MiniMaxM3VLForCausalLM`, model/minimax_m3.py) against
transformers' plain greedy loop, token for token and logits within 1e-3 (float32), on a tiny
random checkpoint transformers writes itself: a dense layer then two expert layers (stacked
experts, a shared expert, a drawn correction bias, routed_scaling_factor), a full-attention and
a sparse layer whose indexer keeps every block within the context, a partial rotary, a SwiGLU
clamp low enough to bite (1.0); chunked into 16-token steps, three prompts sharing steps, a warm
prefix cache, a pool small enough to preempt (measured on transformers: without the drawn
correction biases 12 of the 18 greedy tokens change, without the clamp 9, with the routed
scale 1 10). Also the checkpoint check, the weights estimate,
the context bound, what is refused, and two tensor-parallel ranks."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import built_fixture, case_fixture, fused_moe_at, gpu_test, greedy_test
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
FULL, SPARSE = "full_attention", "minimax_m3_sparse"
CASES = {
    "minimax_m3": dict(
        head_dim=16, intermediate_size=24, num_local_experts=6, num_experts_per_tok=2,
        dense_intermediate_size=48, shared_intermediate_size=32, index_n_heads=2,
        index_head_dim=8, index_block_size=4, index_topk_blocks=3, index_local_blocks=1,
        num_hidden_layers=3,
        mlp_layer_types=["dense", "sparse", "sparse"], layer_types=[FULL, SPARSE, FULL],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        routed_scaling_factor=1.5, swiglu_limit=1.0),
}  # fmt: skip


def write(name: str, path):
    """The correction biases drawn (transformers starts them at zero)."""
    model = make_tiny_model(path, "MiniMaxM3VLText", **CASES[name])
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()
# the fused-MoE kernel's swiglu_oai without biases, CUDA graphs
test_gpu_matches_transformers_with_graphs = gpu_test(fused_moe_at(1))


def test_checkpoint_check_estimate_and_refusals(built):
    """The fields read (the indexer's: sparse past 3 blocks of 4 keys), the whole context, the
    checkpoint check naming a missing fused or stacked MLP tensor or indexer tensor, the
    weights estimate (the indexer's tensors too), a tensor-parallel size that does not divide
    the heads and FP8 refused in one line."""
    from types import SimpleNamespace

    from hybrid_cases import check_missing_refused
    from model_bytes import check_estimate
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype, check_max_model_len

    path, _, loaded, _ = built("minimax_m3")
    mc, f = loaded.config, loaded.config.family
    assert (mc.intermediate_size, f.moe_intermediate_size) == (48, 24)
    assert f.moe_layers == (False, True, True)
    ix = f.block_index
    assert (ix.n_heads, ix.head_dim, ix.block, ix.topk, ix.local) == (2, 8, 4, 3, 1)
    assert ix.layers == (False, True, False) and ix.dense_reach == 12
    assert mc.context_length == check_max_model_len(None, mc) == mc.max_position_embeddings
    assert f.routing.routed_scaling_factor == 1.5
    check_estimate(path, rel=1e-6)
    check_missing_refused(loaded, ["model.layers.0.mlp.gate_up_proj.weight",
                                   "model.layers.1.mlp.experts.gate_up_proj",
                                   "model.layers.2.mlp.shared_experts.down_proj.weight",
                                   "model.layers.1.mlp.gate.e_score_correction_bias",
                                   "model.layers.1.self_attn.indexer.k_proj.weight"])  # fmt: skip
    with pytest.raises(ValueError, match="tensor-parallel-size 3 does not divide the model's 4"):
        check(mc, 3)
    engine = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)
    with pytest.raises(ValueError, match="fp8 is not supported for a minimax_m3"):
        check_dtype(engine, mc)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its heads, its
    rows of each fused gate_up (dense, shared expert, stacked experts), the shared expert's
    partial sum joining the experts' before their all-reduce, the sparse layer's indexer its KV
    head's queries over its own key table; transformers' tokens and logits; rank 0's weights
    estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("minimax_m3")
    check_two_ranks(path, loaded, reference, "minimax_m3", kv_heads=1)
    check_estimate(path, 2, rel=1e-6)


def test_the_released_keys_read_as_transformers_reads_them(tmp_path):
    """`moe_layer_freq` and `sparse_attention_config` (the released config's) give the layer
    kinds and the indexer's sizes; `rotary_dim` is ignored, as transformers does; a layer kind
    it does not run is refused in one line."""
    cfg = {"architectures": ["MiniMaxM3VLForCausalLM"], "model_type": "minimax_m3_vl_text",
           "num_hidden_layers": 3, "head_dim": 128, "rotary_dim": 64, "moe_layer_freq": [0, 1, 1],
           "sparse_attention_config": {"sparse_attention_freq": [0, 1, 1],
                                       "sparse_block_size": 64, "sparse_topk_blocks": 32}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert list(o.family.moe_layers) == [k == "sparse" for k in t.mlp_layer_types]
    ix = o.family.block_index
    assert (ix.block, ix.topk, ix.local) == (t.index_block_size, t.index_topk_blocks, 1)
    assert ix.layers == tuple(k == SPARSE for k in t.layer_types) and ix.dense_reach == 2048
    assert "partial_rotary_factor" not in (o.rope_scaling or {})
    assert "partial_rotary_factor" not in t.rope_parameters
    with torch.device("meta"):  # transformers' count, the indexer's tensors too
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters())
    cfg["layer_types"] = [FULL, "sliding_attention", FULL]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="minimax_m3 layer_types") as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
