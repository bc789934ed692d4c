"""Laguna (`LagunaForCausalLM`, model/laguna.py) against transformers, token for token and
logits within 1e-3 (float32), on tiny random checkpoints transformers writes itself: query heads
by layer (4, 8, 2 over two KV heads), a sliding layer (a window shorter than the prompts, its
own rotary base, the whole head rotating) between full-attention ones (half of each head
rotating at base 500000), attention's softplus output gate per head, a dense first layer, then
experts by sigmoid scores with a choice-only correction bias large enough to change the picks,
renormalised and scaled by `moe_routed_scaling_factor`, beside the shared expert; laguna-elem:
the gate per element, experts in every layer, every layer full attention. Prompts chunked into
16-token steps, three prompts sharing steps, a warm prefix cache, a pool small enough to
preempt; the weights estimate; two tensor-parallel ranks; FP8 refused."""

from __future__ import annotations

import pytest
import torch
from arch_cases import (
    FULL,
    SLIDING,
    built_fixture,
    case_fixture,
    greedy_test,
    scramble_correction_biases,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "laguna": dict(
        head_dim=16, num_attention_heads_per_layer=[4, 8, 2], num_hidden_layers=3,
        layer_types=[FULL, SLIDING, FULL], sliding_window=11, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        moe_routed_scaling_factor=2.5),
    "laguna-elem": dict(
        head_dim=16, num_attention_heads_per_layer=[2, 6], gating="per-element",
        mlp_layer_types=["sparse", "sparse"], num_experts=6, num_experts_per_tok=3,
        moe_intermediate_size=24, shared_expert_intermediate_size=32),
}  # fmt: skip


def write_case(name: str, path):
    model = make_tiny_model(path, "Laguna", **CASES[name])
    scramble_correction_biases(model, path)  # (the sparse layers')
    return model


built = built_fixture(write_case)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_config_fields(built):
    f = read_model_config(str(built("laguna")[0])).family
    assert f.laguna.heads == (4, 8, 2) and f.laguna.gate_per_head
    assert f.window_layers == (False, True, False) and f.moe_layers == (False, True, True)
    assert f.routing.routed_scaling_factor == 2.5 and f.shared_expert_intermediate_size == 48


@pytest.mark.parametrize("name", list(CASES))
def test_the_weights_estimate_is_what_the_model_holds(built, name):
    from model_bytes import check_estimate

    check_estimate(built(name)[0], 1)


def test_fp8_and_query_heads_that_do_not_divide_are_refused(built):
    from types import SimpleNamespace

    from pagoda.runtime.distributed.layout import check
    from pagoda.runtime.engine.start_checks import check_dtype

    mc = read_model_config(str(built("laguna")[0]))
    check(mc, 2)
    with pytest.raises(ValueError, match="does not divide layer 2's 2 query heads"):
        check(mc, 4)
    with pytest.raises(ValueError, match="fp8 is not supported for a laguna"):
        # (an EngineConfig refuses fp8 on this CPU itself: the flag as a GPU's would read)
        check_dtype(SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16), mc)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_from_shapes_as_from_its_tensors(built, name, tp):
    """`fit`'s count from config.json alone (`from_shapes`, 16 bits, one rank's share) against
    the headers': q and o by each layer's heads, the gate per head or per element."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path = built(name)[0]
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, False, tp), rel=1e-6)


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Two ranks: each layer's query heads (4, 8, 2) halved with their gates, the two KV heads
    one a rank, the shared expert and experts by width; transformers' tokens and logits
    chunked, preempted and on a warm cache; rank 0's weights as the estimate counts them."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("laguna")
    check_two_ranks(path, loaded, reference, "laguna", kv_heads=1)
    check_estimate(path, 2, rel=0)


@pytest.mark.skipif(
    __import__("os").environ.get("TRITON_INTERPRET") != "1",
    reason="CPU run of Triton kernels needs TRITON_INTERPRET=1",
)
def test_triton_backend_with_query_heads_by_layer(built):
    """The Triton backend (the prefill, SDPA and decode kernels) reading each layer's query
    heads from its q (4, 8, 2 over one backend of the model's 4), chunked and batched, one
    prompt past the window: transformers' tokens and logits."""
    pytest.importorskip("triton")
    from arch_cases import check_on_triton

    _, model, loaded, _ = built("laguna")
    check_on_triton(model, loaded, (19, 8), "laguna")


def test_a_published_style_config_reads_transformers_defaults(tmp_path):
    """A sparse config.json (poolside/laguna-XS.2's keys left to LagunaConfig's defaults):
    full-attention layers at base 500000 rotating half of each head, sliding ones at 10000
    whole, heads by layer from num_attention_heads, the first MLP dense."""
    import json

    cfg = {"architectures": ["LagunaForCausalLM"], "model_type": "laguna",
           "num_hidden_layers": 4, "layer_types": [SLIDING, SLIDING, SLIDING, FULL]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mc = read_model_config(str(tmp_path))
    f = mc.family
    assert (mc.num_heads, mc.num_kv_heads, mc.head_dim) == (48, 8, 128)
    assert mc.rope_theta == 500_000.0 and mc.rope_scaling["partial_rotary_factor"] == 0.5
    assert f.laguna.heads == (48,) * 4 and f.laguna.gate_per_head
    assert (f.laguna.local_rope_theta, f.laguna.local_rotary) == (10_000.0, 1.0)
    assert f.sliding_window == 512 and f.window_layers == (True, True, True, False)
    assert f.moe_layers == (False, True, True, True) and f.num_experts == 256
    assert f.num_experts_per_tok == 8 and f.shared_expert_intermediate_size == 512
