"""Hunyuan V1 (`HunYuanMoEV1ForCausalLM`, `HunYuanDenseV1ForCausalLM`) against transformers,
token for token and logits within 1e-3 (float32), on tiny random checkpoints transformers writes
itself: prompts chunked into 16-token steps, three prompts sharing steps, a warm prefix cache,
and a pool small enough to preempt.

- hunyuan-moe: per-head q/k norms after rotary, the NTK-alpha rotary (a "dynamic" rotary with
  `alpha`: a larger base), experts in every layer (float32 softmax router, top-2 renormalised)
  beside the shared MLP;
- hunyuan-moe-lists: the released configs' per-layer lists (`moe_topk`,
  `moe_intermediate_size`, `num_shared_expert`), top-3, the default rotary;
- hunyuan-dense: the dense model (Hunyuan-0.5B..7B), tied embeddings, the NTK-alpha rotary.

Also: the config as transformers reads it (the rotary's base, what is refused), the weights
estimate against what the built model holds, and two tensor-parallel ranks (gloo).
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
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
ALPHA = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}  # released
CASES = {
    "hunyuan-moe": ("HunYuanMoEV1", dict(num_experts=8, moe_topk=2, intermediate_size=48,
                                         head_dim=16, rope_parameters=ALPHA)),
    "hunyuan-moe-lists": ("HunYuanMoEV1", dict(
        num_experts=6, moe_topk=[3, 3], intermediate_size=32, moe_intermediate_size=[32, 32],
        num_shared_expert=[1, 1], use_mixed_mlp_moe=True, use_qk_norm=True, head_dim=16)),
    "hunyuan-dense": ("HunYuanDenseV1", dict(head_dim=32, num_attention_heads=2,
                                             tie_word_embeddings=True, rope_parameters=ALPHA)),
}  # fmt: skip


def write_case(name: str, path):
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)
    check_preempted(loaded, reference, name)


def test_config_reads_as_transformers(built):
    """The NTK-alpha rotary as transformers computes it: a base of theta x alpha ** (d / (d -
    2)), no scaling left; the MoE fields."""
    path, model, _, _ = built("hunyuan-moe")
    c = read_model_config(str(path))
    f = c.family
    theirs = model.model.rotary_emb
    assert theirs.rope_type == "ntk_alpha" and c.rope_scaling is None
    assert c.rope_theta == pytest.approx(10000.0 * 1000.0 ** (16 / 14))
    assert (f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (8, 2, 48)
    assert f.shared_expert_intermediate_size == 48 and f.routing.bias is False
    assert read_model_config(str(built("hunyuan-moe-lists")[0])).family.num_experts_per_tok == 3


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [("moe_topk", [2, 3], "moe_topk"), ("moe_intermediate_size", [16, 16], "(48)"),
     ("num_shared_expert", 2, "num_shared_expert"), ("use_cla", True, "cross-layer")],
)  # fmt: skip
def test_what_transformers_would_run_otherwise_is_refused(built, tmp_path, key, value, match):
    path, _, _, _ = built("hunyuan-moe")
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    with pytest.raises(ValueError, match=match):
        read_model_config(str(tmp_path))


@pytest.mark.parametrize(("name", "tp"), [("hunyuan-moe", 1), ("hunyuan-moe", 2),
                                          ("hunyuan-dense", 2)])  # fmt: skip
def test_the_weights_estimate_is_what_the_model_holds(built, name, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the float32
    router (`gate.wg`), the shared MLP, the q/k norms."""
    from model_bytes import check_estimate

    path, _, _, _ = built(name)
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    """Heads split over two ranks (each rank's q/k norms after rotary), experts and the shared
    MLP by width, the router whole on each."""
    path, _, loaded, reference = built("hunyuan-moe")
    check_two_ranks(path, loaded, reference, "hunyuan-moe", kv_heads=1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers_with_graphs(built, name):
    """On CUDA: the experts in the fused-MoE kernel, decodes in CUDA graphs, no host sync."""
    _, _, loaded, reference = built(name)
    check_on_cuda_with_graphs(loaded, reference, name)


@pytest.mark.parametrize("tensor", ["model.layers.0.self_attn.key_layernorm.weight",
                                    "model.layers.1.mlp.gate.wg.weight",
                                    "model.layers.1.mlp.shared_mlp.up_proj.weight"])  # fmt: skip
def test_a_checkpoint_without_one_of_its_tensors_is_refused_at_config_time(built, tmp_path, tensor):
    from safetensors.torch import load_file, save_file

    path, _, _, _ = built("hunyuan-moe")
    tensors = load_file(str(path / "model.safetensors"))
    del tensors[tensor]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"missing tensor '{tensor}'"):
        read_model_config(str(tmp_path))
