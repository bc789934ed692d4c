"""Ergo (`ErgoForCausalLM`, model/ergo.py) against transformers, token for token and logits within
1e-3 (float32), on a tiny random checkpoint transformers writes itself in the published layout
(`tok_embeddings`, `layers.N.attention.wqkv`, `feed_forward.gate_kernel` stored [in, out], ...):
two sliding layers (a window shorter than the prompts, interleaved rotary) then a full one
without rotary, its scores × `global_attention_scale`; a dense ReLU² first layer, then experts
with their own output norms, a correction bias large enough to change the picks, the routed
scale, the normalised shared expert; learned residual gates and four norms a layer drawn away
from their initial values. Prompts chunked into 16-token steps, three prompts sharing steps, a
warm prefix cache, a pool small enough to preempt; the checkpoint check, the weights estimate,
what is refused, a published-style config.json; two tensor-parallel ranks."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import built_fixture, case_fixture, greedy_test
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "ergo": dict(
        num_hidden_layers=3, global_attention_every_n_layers=3, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_intermediate_size=48, first_dense_intermediate_size=96, sliding_window=8,
        global_attention_scale=2.0, rms_norm_eps=1e-6),
}  # fmt: skip


def write_case(name: str, path):
    """The checkpoint, its gates and expert norms away from 0 and 1, the correction biases
    large enough to change the picks."""
    model = make_tiny_model(path, "Ergo", **CASES[name])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for key, t in [*model.named_parameters(), *model.named_buffers()]:
            if key.endswith(("residual_gate.weight", "e_score_correction_bias")):
                t.copy_(torch.randn(t.shape, generator=g))
            if key.endswith("post_expert_norm.weight"):
                t.copy_(1 + 0.3 * torch.randn(t.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its heads, its
    rows of the dense and shared MLPs, two of the four experts whole (their normed outputs
    summed over the ranks), the float32 embedding's vocabulary rows; transformers' tokens and
    logits; rank 0's weights estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("ergo")
    check_two_ranks(path, loaded, reference, "ergo", kv_heads=1)
    check_estimate(path, 2, rel=1e-6)


def test_config_checkpoint_check_estimate_and_refusals(built):
    """Window and rotary on the sliding layers only, the full layer's scale; the published
    names read (the fused q/k/v split, the [in, out] matrices transposed); the checkpoint
    check names a missing expert norm; the weights estimate; a tensor-parallel size that does
    not divide the experts and FP8 refused in one line."""
    import dataclasses
    from types import SimpleNamespace

    from hybrid_cases import check_missing_refused
    from model_bytes import check_estimate
    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype

    path, _, loaded, _ = built("ergo")
    mc = loaded.config
    f = mc.family
    assert f.window_layers == f.rope_layers == (True, True, False)
    assert f.global_attention_scale == 2.0 and f.moe_layers == (False, True, True)
    assert mc.head_dim == 16 and mc.intermediate_size == 96 and f.rope_interleaved
    assert loaded.weights.dtype_and_shape("model.layers.1.mlp.gate.weight")[1] == [4, 64]
    check_missing_refused(loaded, ["model.layers.2.mlp.experts.norm",
                                   "model.layers.0.feedforward_residual_gate.weight",
                                   "model.layers.2.self_attn.k_proj.weight"])  # fmt: skip
    check_estimate(path, rel=1e-6)
    six = dataclasses.replace(mc, family=dataclasses.replace(f, num_experts=6))
    with pytest.raises(ValueError, match=r"tensor-parallel-size 4 does not divide Ergo's "
                                         r"experts \(num_experts 6: each expert"):  # fmt: skip
        check(six, 4)
    check(mc, 4)
    with pytest.raises(ValueError, match="fp8 is not supported for a ergo"):
        check_dtype(SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16), mc)


def test_a_published_style_config_reads_as_transformers_does(tmp_path):
    """A sparse config.json with the published key for the window (`local_attention_window`)
    and a flat rotary (the sliding layers'): ErgoConfig's defaults for the rest, every fourth
    layer full attention without rotary, the first MLP dense; the parameter count transformers
    counts on the meta device."""
    cfg = {"architectures": ["ErgoForCausalLM"], "model_type": "ergo", "num_hidden_layers": 8,
           "local_attention_window": 1024,
           "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    f = mc.family
    assert (mc.num_heads, mc.num_kv_heads, mc.head_dim) == (64, 8, 128)
    assert mc.rope_theta == 500_000.0 and f.sliding_window == 1024
    assert f.window_layers == f.rope_layers == (True, True, True, False) * 2
    assert f.moe_layers == (False,) + (True,) * 7 and f.num_experts == 256
    assert mc.intermediate_size == 32_768 and f.shared_expert_intermediate_size == 8192
    hf = transformers.AutoConfig.for_model(
        "ergo", **{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    )
    with torch.device("meta"):
        model = transformers.ErgoForCausalLM(hf)
    count = sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
    )
    assert mc.num_params == count
