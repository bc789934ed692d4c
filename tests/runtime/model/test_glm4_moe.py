"""GLM-4.5 / GLM-4.6 (`Glm4MoeForCausalLM`) against transformers, token for token and logits
within 1e-3 (float32), on tiny random checkpoints transformers writes itself: prompts chunked
into 16-token steps, three prompts sharing steps, a warm prefix cache, and a pool small enough
to preempt.

- glm45: per-head q/k norms (`use_qk_norm`), q/k/v biases, half of each head rotating
  (rotate-half), a dense first layer, then V3's router (sigmoid, a correction bias large
  enough to change the picks, 4 groups of which 2, renormalised, scaled by 2.5) and one shared
  expert; the checkpoint also carries a multi-token-prediction layer after the decoder, as the
  released ones do (`model.layers.{num_hidden_layers}...`), which is not read;
- glm45-air: no q/k norms, one group, weights not renormalised, two shared experts, experts
  from the first layer on, a quarter of each head rotating.

Also: the weights estimate against what the built model holds (the MTP layer not counted), two
tensor-parallel ranks (gloo) against one, and ``--quantization fp8``.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    built_fixture,
    case_fixture,
    check_two_ranks,
    fused_moe_at,
    generate,
    gpu_test,
    greedy_test,
    prompts,
    scramble_correction_biases,
)
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {
    "glm45": dict(
        use_qk_norm=True, attention_bias=True, head_dim=32, n_routed_experts=8,
        num_experts_per_tok=2, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        norm_topk_prob=True, n_shared_experts=1, moe_intermediate_size=32,
        first_k_dense_replace=1, num_hidden_layers=3),
    "glm45-air": dict(
        use_qk_norm=False, attention_bias=True, head_dim=32, n_routed_experts=6,
        num_experts_per_tok=3, n_group=1, topk_group=1, routed_scaling_factor=1.5,
        norm_topk_prob=False, n_shared_experts=2, moe_intermediate_size=32,
        first_k_dense_replace=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 0.25}),
}  # fmt: skip
MTP = {"glm45"}  # cases whose checkpoint carries a multi-token-prediction layer


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), with random
    correction biases and, for the MTP cases, a multi-token-prediction layer appended as the
    released checkpoints hold it (a decoder layer's tensors plus eh_proj, enorm, hnorm and
    shared_head.norm under `model.layers.{num_hidden_layers}`); returns the model."""
    from safetensors.torch import load_file, save_file

    overrides = CASES[name]
    model = make_tiny_model(path, "Glm4Moe", **overrides)
    g = scramble_correction_biases(model, path, overrides["first_k_dense_replace"])
    if name in MTP:
        tensors = load_file(str(path / "model.safetensors"))
        n, h = model.config.num_hidden_layers, model.config.hidden_size
        last, mtp = f"model.layers.{n - 1}.", f"model.layers.{n}."
        for key in [k for k in tensors if k.startswith(last)]:
            tensors[mtp + key[len(last) :]] = tensors[key].clone()
        tensors[mtp + "eh_proj.weight"] = torch.randn(h, 2 * h, generator=g)
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{mtp}{norm}.weight"] = torch.ones(h)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((path / "config.json").read_text())
        assert cfg["num_nextn_predict_layers"] == 1  # transformers writes it; its model skips it
    return model


built = built_fixture(write_case)


case = case_fixture(CASES)
test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_config_reads_as_transformers(built, tmp_path):
    """The family fields of the glm45 case, and the released checkpoints' format (a top-level
    rope_theta, no partial_rotary_factor): half of each head rotates, as Glm4MoeConfig's
    default."""
    from pagoda.runtime.model.shape_fingerprint import shape_fingerprint

    path, _, _, _ = built("glm45")
    c = read_model_config(str(path))
    f = c.family
    assert c.architecture == "glm4_moe" and c.attention_bias and f.qk_norm
    assert not f.rope_interleaved and c.rope_scaling["partial_rotary_factor"] == 0.5
    assert f.moe_layers == (False, True, True) and f.shared_expert_intermediate_size == 32
    r = f.routing
    assert (r.scoring, r.topk_method, r.n_group, r.topk_group) == ("sigmoid", "noaux_tc", 4, 2)
    assert r.routed_scaling_factor == 2.5 and f.norm_topk_prob
    assert shape_fingerprint(c, "none")["num_moe_layers"] == 2
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg["rope_theta"] = 1e6
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.rope_scaling["partial_rotary_factor"] == theirs["partial_rotary_factor"] == 0.5
    assert ours.rope_theta == theirs["rope_theta"] == 1e6


def test_a_checkpoint_without_the_correction_bias_is_refused_at_config_time(tmp_path):
    from safetensors.torch import load_file, save_file

    make_tiny_model(tmp_path, "Glm4Moe", num_hidden_layers=1, n_routed_experts=4,
                    num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0)  # fmt: skip
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["model.layers.0.mlp.gate.e_score_correction_bias"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.0\.mlp\.gate\.e_score"):
        read_model_config(str(tmp_path))


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the float32
    router and correction bias, the shared experts, q/k norms and biases; the MTP layer the
    checkpoint carries is neither read nor counted."""
    from model_bytes import check_estimate

    path, _, _, _ = built("glm45")
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    """Heads split over two ranks (q/k/v with their biases, per-head q/k norms on each), the
    experts and shared experts by width, the router whole on each: transformers' tokens and
    logits, chunked, preempted and on a warm cache."""
    path, _, loaded, reference = built("glm45")
    check_two_ranks(path, loaded, reference, "glm45", kv_heads=1)


@pytest.mark.slow  # Triton's interpreter on a CPU: ~10 s
def test_quantization_fp8_runs_the_projections_in_fp8(built):
    """``--quantization fp8`` (where the FP8 kernels run: CUDA, or Triton's interpreter on a
    CPU): attention, the dense MLP and the shared experts in the FP8 GEMM, the router and the
    routed experts in the model's dtype; the logits within FP8's error of transformers'."""
    import os

    from pagoda.runtime.model.fp8_linear import Fp8Linear

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the FP8 kernels run on a CPU under TRITON_INTERPRET=1 only")
    _, _, loaded, reference = built("glm45")
    llm = LLM(loaded=loaded, dtype="float32", quantization="fp8", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    model = llm.engine.runner.model
    dense, moe = model.layers[0], model.layers[1]
    assert isinstance(dense.qkv, Fp8Linear) and isinstance(dense.mlp.down, Fp8Linear)
    assert isinstance(moe.mlp.shared.down, Fp8Linear)
    assert not isinstance(moe.mlp.routed.route.linear, Fp8Linear)
    got = generate(llm, prompts(), n=1)  # (the one step compared: no decodes)
    for (_, logits), (_, want) in zip(got, reference):
        # E4M3 weights and per-token activations through three layers (3 mantissa bits): the
        # first step's logits point where transformers' do (scrambled weights: cosine ~0)
        assert torch.nn.functional.cosine_similarity(logits[0], want[0], dim=0) > 0.98


# On CUDA (benchmarks/gpu_check.sh's `families` step): the experts in the fused-MoE kernel,
# decodes in CUDA graphs, eager as graphs, no host sync in a step's launch
test_gpu_matches_transformers_with_graphs = gpu_test(fused_moe_at(-1))
