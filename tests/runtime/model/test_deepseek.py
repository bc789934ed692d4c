"""DeepSeek-V2 and DeepSeek-V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`) against
transformers, token for token and logits within 1e-3 (float32), on tiny random checkpoints
transformers writes itself: prompts chunked into 16-token steps, a warm prefix cache, three
prompts sharing steps, and a pool small enough to preempt.

- v2-lite: q_proj (no q bottleneck), greedy softmax routing, two shared experts, a dense first
  layer, v_head_dim below the qk head;
- v2-attention-bias: attention_bias (kv_a_proj_with_mqa's and o_proj's; q_proj has none);
- v2-grouped-yarn: q_lora, group_limited_greedy routing, routed_scaling_factor, yarn rotary
  with mscale_all_dim (the softmax scale's mscale squared);
- v3: q_lora, sigmoid scores with e_score_correction_bias (noaux_tc, best-two group sums),
  renormalised and scaled weights, v_head_dim above the qk head;
- v3-no-interleave: rope_interleave false (rotate-half rotary);
- youtu (`YoutuForCausalLM`: Youtu-LLM): V3's latent attention (q_lora, interleaved rotary) over
  a dense SwiGLU MLP in every layer, tied embeddings.
- glm4.7-flash (`Glm4MoeLiteForCausalLM`): DeepSeek-V3's attention and router with the MLP kind
  of each layer from ``mlp_layer_types`` (here dense, experts, dense: no first_k_dense_replace),
  v_head_dim above the qk head, one expert group.

Every case caches one latent row per token and layer (kv_lora_rank 32 + qk_rope_head_dim 16)
and attends in the absorbed form. Also: the cache's size (one row, one tensor), two
tensor-parallel ranks (heads split) against one, the latent cache through the Triton kernels,
and DeepSeek-V3's block-wise FP8 release format.
"""

from __future__ import annotations

import pytest
import torch
from arch_cases import (
    built_fixture,
    check,
    check_chunked_cached_batched,
    check_preempted,
    fused_moe_at,
    generate,
    gpu_test,
    prompts,
    scramble_correction_biases,
)
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model

transformers = pytest.importorskip("transformers")
NEW = 6
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, num_key_value_heads=4)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.9,
        "mscale_all_dim": 0.8, "original_max_position_embeddings": 128}  # fmt: skip
CASES = {
    "v2-lite": ("DeepseekV2", dict(
        MLA, q_lora_rank=None, v_head_dim=32, n_routed_experts=6, num_experts_per_tok=2,
        n_shared_experts=2, moe_intermediate_size=32, first_k_dense_replace=1)),
    "v2-attention-bias": ("DeepseekV2", dict(  # biases on kv_a and o, none on q_proj
        MLA, q_lora_rank=None, v_head_dim=32, attention_bias=True, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
        first_k_dense_replace=1)),
    "v2-grouped-yarn": ("DeepseekV2", dict(
        MLA, q_lora_rank=24, v_head_dim=48, n_routed_experts=6, num_experts_per_tok=3,
        topk_method="group_limited_greedy", n_group=3, topk_group=2, routed_scaling_factor=2.0,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=0,
        rope_parameters=YARN)),
    "v3": ("DeepseekV3", dict(
        MLA, q_lora_rank=24, v_head_dim=64, n_routed_experts=8, num_experts_per_tok=2,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        num_hidden_layers=3)),
    "v3-no-interleave": ("DeepseekV3", dict(
        MLA, q_lora_rank=24, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=3,
        n_group=2, topk_group=1, routed_scaling_factor=1.5, norm_topk_prob=False,
        n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        rope_interleave=False)),
    "youtu": ("Youtu", dict(MLA, q_lora_rank=24, v_head_dim=32, intermediate_size=96)),
    "glm4.7-flash": ("Glm4MoeLite", dict(
        MLA, q_lora_rank=24, v_head_dim=48, n_routed_experts=8, num_experts_per_tok=3,
        n_group=1, topk_group=1, routed_scaling_factor=1.8, n_shared_experts=1,
        moe_intermediate_size=32, num_hidden_layers=3,
        mlp_layer_types=["dense", "sparse", "dense"])),
}  # fmt: skip
PREEMPTING = ["v2-lite", "v3", "youtu"]


def write_case(name: str, path, **changes):
    """Case `name`'s checkpoint (its config with `changes`) written to `path` by transformers:
    the model (float32, eval)."""
    arch, overrides = CASES[name]
    overrides = {**overrides, **changes}
    model = make_tiny_model(path, arch, **overrides)
    if arch == "DeepseekV3":  # a correction bias large enough to change the experts picked
        scramble_correction_biases(model, path, overrides["first_k_dense_replace"])
    if arch == "Glm4MoeLite":  # (its one layer of experts)
        scramble_correction_biases(model, path)
    return model


# v2-lite's one dense layer: the Triton tests' model (the kernels run each layer alike; two
# layers took twice as long in the interpreter)
built = built_fixture(
    lambda name, path: (
        write_case("v2-lite", path, num_hidden_layers=1)
        if name == "v2-lite-1"
        else write_case(name, path)
    )
)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, built):
    return request.param, *built(request.param)[2:]


def test_greedy_matches_transformers_chunked_cached_and_batched(case):
    name, loaded, reference = case
    llm = check_chunked_cached_batched(loaded, reference, name)
    llm.engine.check_integrity()


@pytest.mark.parametrize("name", PREEMPTING)
def test_greedy_matches_transformers_under_preemption(built, name):
    _, _, loaded, reference = built(name)
    check_preempted(loaded, reference, name)


def test_bf16_greedy_does_not_depend_on_cache_chunks_or_batch(built):
    """In bfloat16 (the CPU default where bf16 is native) the latent attention's and the
    float32 router's rows keep their bits: a prompt alone on a plain engine and among others,
    chunked, on a warm cache give the same tokens."""
    from pagoda.runtime.model.linear import bf16_rows_invariant

    if not bf16_rows_invariant():
        pytest.skip("bf16 GEMMs on AMX round a row by the row count (docs/runtime.md)")
    _, _, loaded, _ = built("v3")  # V3's sigmoid router, q and k padded for a wider value
    common = dict(loaded=loaded, dtype="bfloat16", kv_cache_memory=16 << 20)
    plain = LLM(**common, enable_prefix_caching=False, enable_chunked_prefill=False)
    alone = [generate(plain, [p])[0][0] for p in prompts()]
    busy = LLM(**common, max_num_batched_tokens=16, max_num_seqs=4)
    for run in ("cold", "warm"):
        assert [t for t, _ in generate(busy, prompts())] == alone, run


def test_the_cache_holds_one_latent_row_per_token(built, tmp_path):
    """A layer caches kv_lora_rank + qk_rope_head_dim values per token in one tensor that is
    both K and V (no V tensor, no per-head rows): the runner's bytes per block, the tensors it
    allocates, the memory estimate and the fit check all count that row (48 float32 values a
    layer here); DeepSeek-V3's published shape: 61 x 576 x 2 bytes, 68.6 KiB a token in bf16
    (the cache expanded per head took 5.7 MiB)."""
    import json
    from pathlib import Path

    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import fit, memory

    _, _, loaded, _ = built("v3")
    mc, row = loaded.config, 32 + 16
    runner = LLM(loaded=loaded, dtype="float32", kv_cache_memory=1 << 20).engine.runner
    want = mc.num_layers * row * 4
    assert runner.backend.latent == 32 and runner.bytes_per_block == runner.block_size * want
    assert all(k is v for k, v in runner.kv_caches)
    held = sum(k.untyped_storage().nbytes() for k, _ in runner.kv_caches)
    assert held == runner.num_blocks * runner.bytes_per_block
    assert memory.kv_bytes_per_token(mc, torch.float32, "auto") == want
    assert fit.Plan(torch.float32, False, False).kv_bytes_per_token(mc) == want
    config = json.loads((Path(loaded.path) / "config.json").read_text())
    config.update(num_hidden_layers=61, num_attention_heads=128, hidden_size=7168,
                  kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    v3 = read_model_config(str(tmp_path))
    assert (v3.num_kv_heads, v3.head_dim) == (1, 576)
    assert memory.kv_bytes_per_token(v3, torch.bfloat16, "auto") == 61 * 576 * 2  # 68.6 KiB
    assert fit.Plan(torch.bfloat16, False, True, tp=8).kv_bytes_per_token(v3) == 61 * 576


@pytest.mark.slow  # ~15 s in Triton's interpreter
@pytest.mark.parametrize("invariant", [True, False])
def test_the_triton_backend_reads_the_latent_cache(built, invariant):
    """The latent cache through the Triton kernels (Triton's interpreter on a CPU, the GPU where
    there is one): one KV head of 48 columns (not a power of two: the kernels' masked tail)
    read as keys and, from the same tensor, as values (the output's first 32 columns);
    chunked, batched and on a warm prefix cache; batch-invariant (every row in the prefill
    kernel) or not (decodes in the split-KV kernel, prompts through SDPA): transformers' tokens
    and logits."""
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernels run on a CPU under TRITON_INTERPRET=1 only")
    _, _, loaded, reference = built("v2-lite-1")
    llm = LLM(loaded=loaded, attention_backend="triton", dtype="float32",
              kv_cache_memory=16 << 20, max_num_batched_tokens=16, max_num_seqs=4,
              batch_invariant=invariant)  # fmt: skip
    runner = llm.engine.runner
    assert runner.backend.latent == 32 and runner.kv_caches[0][0] is runner.kv_caches[0][1]
    for run in ("cold", "warm"):
        for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
            check(got, want, f"v2-lite-1: prompt {i}, triton, {run}")
    assert llm.engine.kv.prefix_hits > 0


@pytest.mark.slow  # two engines, one of two ranks (gloo): ~10 s
@pytest.mark.parametrize("name", ["v2-lite", "v3"])  # q_proj and the q bottleneck split
def test_two_tensor_parallel_ranks_give_one_ranks_tokens(built, name):
    """Heads split over two ranks (q_proj's or q_b_proj's rows, kv_b_proj's rows, o_proj's
    columns; the bottleneck and the latent whole on each), experts and shared experts by width:
    the tokens of one rank and transformers' logits, chunked, preempted and on a warm cache."""
    _, _, loaded, reference = built(name)
    pool = dict(num_blocks_override=7, block_size=16, max_model_len=96,
                max_num_batched_tokens=16, max_num_seqs=3, dtype="float32")  # fmt: skip
    one = LLM(str(loaded.path), loaded=loaded, **pool)
    want = generate(one, prompts()) + generate(one, prompts()[::-1])[::-1]
    with LLM(str(loaded.path), loaded=loaded, tensor_parallel_size=2, **pool) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        assert two.engine.scheduler.num_preemptions > 0 and two.engine.kv.prefix_hits > 0
        assert two.engine.runner.backend.num_heads == 2  # this rank's half of 4
        two.engine.check_integrity()
    assert [t for t, _ in got] == [t for t, _ in want]
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"{name}: prompt {i}, two ranks")


def test_block_wise_fp8_checkpoint_as_deepseek_v3_publishes_it(tmp_path):
    """DeepSeek-V3's FP8 release: every decoder projection (latent attention, dense MLP, experts,
    shared experts) in E4M3 with a float32 `weight_scale_inv` per weight tile (partial tiles at
    the edges), the router, norms, embedding and head in 16 bits. It loads dequantized and gives
    transformers' tokens and logits on its dequantized weights."""
    from fp8_testlib import write_blocks_of

    arch, overrides = CASES["v3"]
    make_tiny_model(tmp_path / "orig", arch, **overrides)
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [32, 32]}  # fmt: skip
    projections = ("proj.weight", "proj_with_mqa.weight")
    write_blocks_of(tmp_path / "orig", tmp_path, qc, (32, 32), lambda n: n.endswith(projections))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized").eval()
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    loaded = load_model(str(tmp_path / "fp8"))
    assert loaded.fp8_scheme.block == (32, 32)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4, block_size=16)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"FP8 V3: prompt {i}")


def test_a_v2_noaux_tc_router_is_refused_by_name(tmp_path):
    """DeepseekV2's router is greedy or group_limited_greedy (transformers' V2 has no other
    branch): noaux_tc on it is refused by name, not reported as a missing
    e_score_correction_bias."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    arch, overrides = CASES["v2-grouped-yarn"]
    make_tiny_model(tmp_path, arch, **overrides)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "topk_method": "noaux_tc"}))
    with pytest.raises(ValueError, match="topk_method 'noaux_tc' is not supported for deepseek_v2"):
        read_model_config(str(tmp_path))


# On CUDA (benchmarks/gpu_check.sh's `families` step): the latent attention at its padded head
# size through the compiled Triton kernels, the routed experts in the fused-MoE kernel (not every
# expert), decodes in CUDA graphs, eager as graphs, no host sync in a step's launch
test_gpu_matches_transformers_with_graphs = gpu_test(fused_moe_at(-1))


def test_youtu_sparse_config_reads_as_transformers(tmp_path):
    """Youtu-LLM-2B's config.json as published (shrunk): no experts, tied embeddings and the
    interleaved rotary by YoutuConfig's defaults, V3's latent shapes; an `n_routed_experts` it
    may carry (YoutuConfig does not read one) builds no experts."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    cfg = dict(architectures=["YoutuForCausalLM"], model_type="youtu", hidden_size=64,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=32,
               qk_rope_head_dim=16, v_head_dim=32, vocab_size=300, n_routed_experts=8,
               rope_theta=1_600_000)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert c.tie_word_embeddings == theirs.tie_word_embeddings is True
    assert c.rope_theta == theirs.rope_parameters["rope_theta"] == 1_600_000
    assert c.family.mla.rope_interleave == theirs.rope_interleave is True
    assert c.family.num_experts == 0 and c.intermediate_size == 96
    assert c.family.attention_multiplier == pytest.approx((32 + 16) ** -0.5)


# GLM-4.7-Flash's config.json as the hub has it (its keys, the shapes shrunk to 4 layers): no
# mlp_layer_types (transformers' default: the first layer dense), a first_k_dense_replace that
# transformers does not read, rope_theta on top, partial_rotary_factor 1
GLM47_FLASH = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite",
    "attention_bias": False, "attention_dropout": 0.0, "pad_token_id": 154820,
    "eos_token_id": [154820, 154827, 154829], "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10240, "max_position_embeddings": 202752,
    "moe_intermediate_size": 1536, "topk_method": "noaux_tc", "norm_topk_prob": True,
    "num_attention_heads": 20, "n_group": 1, "topk_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 1, "routed_scaling_factor": 1.8, "num_experts_per_tok": 4,
    "first_k_dense_replace": 1, "num_hidden_layers": 4, "num_key_value_heads": 20,
    "num_nextn_predict_layers": 1, "partial_rotary_factor": 1.0, "kv_lora_rank": 512,
    "q_lora_rank": 768, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000, "rope_scaling": None,
    "tie_word_embeddings": False, "dtype": "bfloat16", "vocab_size": 154880,
}  # fmt: skip


@pytest.mark.parametrize("layer_types", [None, ["dense", "sparse", "dense", "sparse"]])
def test_a_published_glm47_flash_config_reads_as_transformers_reads_it(tmp_path, layer_types):
    """GLM-4.7-Flash's config.json: the latent row (512 + 64), V3's router with one group and
    its scaling, the experts in the layers transformers' ``mlp_layer_types`` names (its default
    where config.json has none), the norm's eps and the rotary base, as transformers reads
    them."""
    import json

    from pagoda.runtime.model.loader import read_model_config

    cfg = {**GLM47_FLASH, **({"mlp_layer_types": layer_types} if layer_types else {})}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f = ours.family
    assert ours.architecture == "glm4_moe_lite"
    assert (ours.num_kv_heads, ours.head_dim) == (1, 512 + 64)
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert (f.mla.q_lora_rank, f.mla.v_head_dim, f.mla.rope_interleave) == (768, 256, True)
    r = f.routing
    assert (r.scoring, r.topk_method, r.n_group, r.routed_scaling_factor) == (
        "sigmoid",
        "noaux_tc",
        1,
        theirs.routed_scaling_factor,
    )
    assert (f.num_experts, f.num_experts_per_tok, f.norm_topk_prob) == (64, 4, True)
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    assert f.attention_multiplier == pytest.approx((192 + 64) ** -0.5)
