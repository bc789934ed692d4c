"""ERNIE 4.5 MoE (`Ernie4_5_MoeForCausalLM`) against transformers, token for token and logits
within 1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked
into 16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough
to preempt.

- ernie45-moe: the interleaved float32 rotary of dense ERNIE 4.5, a dense first layer, then a
  float32 softmax router whose choice adds a correction bias large enough to change the picks
  (`moe_statics.e_score_correction_bias`, [1, E]), weights from the uncorrected probabilities,
  renormalised, beside two shared experts; tied embeddings;
- ernie45-moe-interval: experts in every second layer up to `moe_layer_end_index` (1 and 3 of
  5), one shared
  expert, top-3, an untied head.

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
CASES = {
    "ernie45-moe": dict(moe_num_experts=8, moe_k=2, moe_intermediate_size=32,
                        moe_num_shared_experts=2, moe_layer_start_index=1, num_hidden_layers=3),
    "ernie45-moe-interval": dict(
        moe_num_experts=6, moe_k=3, moe_intermediate_size=24, moe_num_shared_experts=1,
        moe_layer_start_index=0, moe_layer_end_index=3, moe_layer_interval=2,
        num_hidden_layers=5, tie_word_embeddings=False),
}  # fmt: skip


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), with random
    correction biases on its expert layers; returns the model."""
    model = make_tiny_model(path, "Ernie4_5_Moe", **CASES[name])
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                bias = layer.mlp.gate.moe_statics.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=g) * 0.3)
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_reads_as_transformers(built):
    path, model, _, _ = built("ernie45-moe-interval")
    c = read_model_config(str(path))
    f = c.family
    assert c.architecture == "ernie4_5_moe" and f.rope_interleaved and not c.tie_word_embeddings
    assert f.moe_layers == tuple(hasattr(x.mlp, "gate") for x in model.model.layers)
    assert f.moe_layers == (False, True, False, True, False)
    r = f.routing
    assert (r.scoring, r.topk_method, r.bias) == ("softmax", "greedy", True)
    assert f.shared_expert_intermediate_size == 24 and f.num_experts_per_tok == 3


def test_the_bias_changes_the_picks_and_a_missing_one_is_refused(built, tmp_path):
    """Without the correction bias the engine would pick other experts (the case tests it);
    a checkpoint without it is refused at config time, one line naming the tensor."""
    from safetensors.torch import load_file, save_file

    path, _, _, _ = built("ernie45-moe")
    tensors = load_file(str(path / "model.safetensors"))
    assert tensors["model.layers.1.mlp.moe_statics.e_score_correction_bias"].shape == (1, 8)
    del tensors["model.layers.1.mlp.moe_statics.e_score_correction_bias"]
    for f in ("config.json", "tokenizer.json"):
        (tmp_path / f).write_bytes((path / f).read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.1\.mlp\.moe_statics"):
        read_model_config(str(tmp_path))


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the float32
    router and [1, E] correction bias, the shared experts, the dense layer."""
    from model_bytes import check_estimate

    path, _, _, _ = built("ernie45-moe")
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    path, _, loaded, reference = built("ernie45-moe")
    check_two_ranks(path, loaded, reference, "ernie45-moe", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    """On CUDA: the experts in the fused-MoE kernel, decodes in CUDA graphs, no host sync."""
    _, _, loaded, reference = built(name)
    runner = check_on_cuda_with_graphs(loaded, reference, name).engine.runner
    moe = runner.model.layers[-2].mlp
    assert getattr(moe, "routed", moe).fused is not None
