"""AfMoE (`AfmoeForCausalLM`: Trinity) against transformers, token for token and logits within
1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked into
16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to
preempt.

- afmoe: four norms a layer, per-head q/k norms, attention's output gated by a sigmoid, window
  layers (shorter than the prompts) rotating and every second layer global without rotary, a
  dense first layer, then experts by sigmoid scores with a choice-only bias large enough to
  change the picks, renormalised and scaled by `route_scale`, beside two shared experts;
- afmoe-mup: the muP embedding scale (sqrt(hidden_size)), every layer a window layer, experts
  from the first layer on, one shared expert.

Also: the weights estimate against what the built model holds, and two tensor-parallel ranks
(gloo: the output gate split by heads).
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
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
CASES = {
    "afmoe": dict(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                  num_shared_experts=2, num_dense_layers=1, route_scale=2.0, num_hidden_layers=4,
                  sliding_window=11, global_attn_every_n_layers=2, **IDS),
    "afmoe-mup": dict(head_dim=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
                      num_shared_experts=1, num_dense_layers=0, mup_enabled=True,
                      sliding_window=40, global_attn_every_n_layers=8, **IDS),
}  # fmt: skip


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), the routers
    (which transformers initialises to zero) and choice biases random; returns the model."""
    model = make_tiny_model(path, "Afmoe", **CASES[name])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "router"):
                layer.mlp.router.gate.weight.normal_(0.0, 1.0, generator=g)
                layer.mlp.expert_bias.copy_(torch.randn(layer.mlp.expert_bias.shape, generator=g))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_reads_as_transformers(built):
    path, _, _, _ = built("afmoe")
    f = read_model_config(str(path)).family
    assert f.window_layers == f.rope_layers == (True, False, True, False)
    assert f.moe_layers == (False, True, True, True) and f.routing.routed_scaling_factor == 2.0
    assert f.embedding_multiplier == 1.0
    assert read_model_config(str(built("afmoe-mup")[0])).family.embedding_multiplier == 8.0


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    from model_bytes import check_estimate

    path, _, _, _ = built("afmoe")
    check_estimate(path, tp)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp, fp8):
    """`fit`'s count from config.json alone (`from_shapes`) against the headers' on a GPU:
    attention's output gate (in FP8 with the projections) and the four norms a layer counted
    (they were left out: 9% under), and its per-head q/k norms: exact."""
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights

    path, _, _, _ = built("afmoe")
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    place = weights.Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    assert got == pytest.approx(weights.from_shapes(mc, torch.bfloat16, fp8, tp), rel=1e-6)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("afmoe")
    check_two_ranks(path, loaded, reference, "afmoe", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    moe = runner.model.layers[-1].mlp
    assert getattr(moe, "routed", moe).fused is not None


@pytest.mark.parametrize(
    "tensor",
    ["model.layers.1.self_attn.gate_proj.weight", "model.layers.2.mlp.expert_bias",
     "model.layers.3.post_mlp_layernorm.weight", "model.layers.1.mlp.router.gate.weight"],
)  # fmt: skip
def test_a_checkpoint_without_one_of_its_tensors_is_refused_at_config_time(built, tmp_path, tensor):
    from safetensors.torch import load_file, save_file

    path, _, _, _ = built("afmoe")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors[tensor]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"missing tensor '{tensor}'"):
        read_model_config(str(tmp_path))
