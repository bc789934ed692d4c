"""DeepSeek Sparse Attention (`DeepseekV32ForCausalLM`: DeepSeek-V3.2; `GlmMoeDsaForCausalLM`:
GLM-5; `AXK2ForCausalLM`: A.X-K2) against transformers, token for token and logits within 1e-3 (float32), on tiny random
checkpoints transformers writes itself, with an ``index_topk`` small enough that the indexer's
choice changes the tokens: prompts of 53, 23 and 48 tokens chunked into 16-token steps, three
prompts sharing steps (decodes beside prefill chunks), a warm prefix cache, a pool small enough
to preempt.

- v32-top8: every layer's indexer keeps 8 keys (rotate-half rotary on its first dims), so
  prefill chunks and decodes past 8 tokens attend sparsely; a dense first layer;
- glm5-top24: GLM-5's interleaved indexer rotary, ``indexer_types`` full / shared / full (the
  shared layer reuses the first one's choice), 24 keys: the first steps attend densely (no
  sequence past 24 tokens), then the 53- and 48-token prompts' later chunks sparsely, and the
  23-token prompt crosses 24 while decoding;
- axk2-top8: A.X-K2 (`AXK2ForCausalLM`) on v32-top8's shape: its gated norms, the attention's
  output gate fused into q_b_proj, two expert groups whose losers score 0 (not -inf).

Also: two tensor-parallel ranks, the cache row (latent, rotary key, indexer key), the refusals
(``--quantization fp8``, int8/FP8 KV caches), the block-wise FP8 release format and the
published configs read as transformers reads them.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import built_fixture, check_chunked_cached_batched, check_preempted, prompts
from hf_oracle import make_tiny_model

transformers = pytest.importorskip("transformers")
MLA = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, num_key_value_heads=4,
           q_lora_rank=24, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
           topk_group=1, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
           index_head_dim=32)  # fmt: skip
# 16 index heads: a token whose every head weight is negative prefers keys that no head scores
# (exact zeros, tied: torch.topk breaks such ties its own way), 1 in 2^16 here
CASES = {
    "v32-top8": ("DeepseekV32", dict(MLA, index_n_heads=16, index_topk=8, num_hidden_layers=2)),
    "glm5-top24": ("GlmMoeDsa", dict(MLA, index_n_heads=16, index_topk=24, num_hidden_layers=3,
                                     indexer_types=["full", "shared", "full"])),
    # A.X-K2: gated norms (rank 8), the attention's output gate, expert groups whose losers
    # score 0 (biases low enough that a kept group has fewer than two experts above 0)
    "axk2-top8": ("AXK2", dict(MLA, index_n_heads=16, index_topk=8, num_hidden_layers=2,
                               gated_norm_rank=8)),
    # Dots3 Note's text model, every layer indexed: GLM-5's interleaved indexer rotary, its
    # scaled bottleneck and latent, the rotary key's norm, a gate per head, norms' eps 1e-5,
    # shared experts of their own width, rotary base 80M
    "dots3-top8": ("Dots3NoteText", dict(MLA, head_dim=48, index_n_heads=16, index_topk=8,
                                         num_hidden_layers=2, use_sliding_window=False,
                                         shared_experts_intermediate_size=24)),
}  # fmt: skip
BIAS_SHIFT = {"axk2-top8": -2.0}


def write_case(name: str, path):
    arch, overrides = CASES[name]
    model = make_tiny_model(path, arch, **overrides)
    g = torch.Generator().manual_seed(2)  # correction biases that change the experts picked
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(torch.randn(bias.shape, generator=g) + BIAS_SHIFT.get(name, 0.0))
    model.save_pretrained(path)
    return model


built = built_fixture(write_case)


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_chunked_cached_and_batched(built, name):
    _, model, loaded, reference = built(name)
    # the indexer's choice matters here: transformers keeping every key gives other logits
    ids = torch.tensor([prompts()[0]])
    with torch.no_grad():
        sparse = model(ids).logits[0, -1]
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.index_topk = 10**6
        dense = model(ids).logits[0, -1]
        for layer in model.model.layers:
            if layer.self_attn.indexer is not None:
                layer.self_attn.indexer.index_topk = CASES[name][1]["index_topk"]
    assert (sparse - dense).abs().max() > 0.05
    llm = check_chunked_cached_batched(loaded, reference, name)
    llm.engine.check_integrity()
    # the rows' indexer columns: keys in a full layer's, zeros in a shared one's (not whatever
    # memory held: 0 x NaN in the dense attention is NaN)
    m = loaded.config.family.mla
    for i, full in enumerate(m.indexer.full_layers):
        rows = llm.engine.runner.kv_caches[i][0]
        tail = rows.view(-1, rows.shape[-1])[:, m.kv_lora_rank + m.qk_rope_head_dim :]
        assert bool((tail == 0).all()) != full, i


def test_greedy_matches_transformers_under_preemption(built):
    _, _, loaded, reference = built("v32-top8")
    check_preempted(loaded, reference, "v32-top8")


def test_the_cache_row_holds_the_indexer_key(built):
    """One row per token and layer: the latent (32), the rotary key (16), the indexer's key
    (32), in one tensor that is K and V; the runner, the memory estimate and DeepSeek-V3.2's
    published shape (61 x (512 + 64 + 128) x 2 bytes, 84 KiB a token in bf16) count it."""
    from pagoda.runtime import LLM
    from pagoda.runtime.server import memory

    _, _, loaded, _ = built("v32-top8")
    mc, row = loaded.config, 32 + 16 + 32
    assert (mc.num_kv_heads, mc.head_dim) == (1, row)
    runner = LLM(loaded=loaded, dtype="float32", kv_cache_memory=1 << 20).engine.runner
    assert runner.backend.latent == 32 and runner.cuda_graphs is None
    assert runner.bytes_per_block == runner.block_size * mc.num_layers * row * 4
    assert memory.kv_bytes_per_token(mc, torch.float32, "auto") == mc.num_layers * row * 4


@pytest.mark.slow  # two engines, one of two ranks (gloo): ~10 s
def test_two_tensor_parallel_ranks_give_transformers_tokens(built):
    """GLM-5's case over two ranks (heads split as DeepSeek-V3's; the indexer, its keys and the
    latent row whole on every rank, so each rank keeps the same tokens), chunked, preempted and
    on a warm cache: transformers' tokens and logits."""
    from arch_cases import check_two_ranks

    path, _, loaded, reference = built("glm5-top24")
    check_two_ranks(path, loaded, reference, "glm5-top24")


def test_what_is_not_supported_is_refused_in_one_line(built):
    """--quantization fp8 (where a GPU would take it) and an int8 KV cache: one ValueError
    each."""
    from pagoda.runtime.config import CacheConfig, EngineConfig
    from pagoda.runtime.engine.start_checks import check_dtype

    _, _, loaded, _ = built("v32-top8")
    mc = loaded.config
    fp8 = EngineConfig(model="m")
    object.__setattr__(fp8, "quantization", "fp8")  # (a CPU config refuses it before)
    for cfg in (fp8, EngineConfig(model="m", cache=CacheConfig(kv_cache_dtype="int8"))):
        with pytest.raises(ValueError, match="not supported for a deepseek_v32 model"):
            check_dtype(cfg, mc)
    check_dtype(EngineConfig(model="m"), mc)


# DeepSeek-V3.2-Exp's config.json as the hub has it (its keys; 4 layers): no mlp_layer_types,
# yarn rotary, the indexer's sizes
V32_EXP = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 4,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip


@pytest.mark.parametrize(
    "changes",
    [{}, {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
          "index_topk_freq": 2, "index_skip_topk_offset": 1},
     {"model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
      "index_topk_pattern": "FSFS"}],
    ids=["v3.2-exp", "glm5-freq", "glm5-pattern"],
)  # fmt: skip
def test_published_configs_read_as_transformers_reads_them(tmp_path, changes):
    """The indexer's sizes, which layers run one (GLM-5's index_topk_freq / offset or pattern,
    as transformers derives ``indexer_types``), the experts' layers, the router, the yarn
    softmax scale and the cache row (512 + 64 + 128), as AutoConfig reads them."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps({**V32_EXP, **changes}))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f, ix = ours.family, ours.family.mla.indexer
    assert (ix.n_heads, ix.head_dim, ix.topk) == (64, 128, 2048)
    full = tuple(t == "full" for t in getattr(theirs, "indexer_types", ["full"] * 4))
    assert ix.full_layers == full and (changes == {} or full != (True,) * 4)
    assert ix.rope_interleave == (changes != {}) and f.mla.rope_interleave
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert (f.routing.scoring, f.routing.n_group, f.routing.topk_group) == ("sigmoid", 8, 4)
    assert (ours.num_kv_heads, ours.head_dim) == (1, 512 + 64 + 128)
    mscale = 0.1 * 1.0 * torch.log(torch.tensor(40.0)).item() + 1.0
    assert f.attention_multiplier == pytest.approx(192**-0.5 * mscale**2)


# A.X-K2's config.json as AXK2Config writes its defaults (A.X-K2-Light's shape), sparse, with the
# legacy keys it derives mlp_layer_types from (4 layers; a frequency of 2: layer 2 alone routed)
AXK2_LIGHT = {"architectures": ["AXK2ForCausalLM"], "model_type": "axk2", "num_hidden_layers": 4,
              "first_k_dense_replace": 1, "moe_layer_freq": 2, "n_group": None,
              "topk_group": None, "rope_theta": 10000.0}  # fmt: skip


def test_a_published_style_axk2_config_reads_as_transformers_reads_it(tmp_path):
    """AXK2Config's defaults: the gated norms' rank, the MLP kinds from first_k_dense_replace and
    moe_layer_freq, routing without groups (null n_group), the indexer (rotate-half), the cache
    row (128 + 32 + 128) and transformers' own parameter count (meta device)."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(AXK2_LIGHT))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f, ix = ours.family, ours.family.mla.indexer
    assert ours.architecture == "axk2" and f.gated_norm_rank == theirs.gated_norm_rank == 16
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert f.moe_layers == (False, False, True, False)
    assert (f.routing.n_group, f.routing.topk_group, f.routing.zero_other_groups) == (1, 1, True)
    assert (ix.n_heads, ix.head_dim, ix.topk, ix.rope_interleave) == (16, 128, 2048, False)
    assert f.mla.output_gate and (ours.num_kv_heads, ours.head_dim) == (1, 128 + 32 + 128)
    assert (ours.vocab_size, ours.hidden_size, ours.num_heads) == (163_840, 2048, 32)
    assert (ours.bos_token_id, list(ours.eos_token_ids)) == (163_691, [163_691])
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(theirs)
    assert ours.num_params == sum(p.numel() for p in hf.parameters())


DOTS3 = {"architectures": ["Dots3NoteForCausalLM"], "model_type": "dots3_note_text",
         "num_hidden_layers": 4}  # fmt: skip


def test_dots3_note_configs_read_as_transformers_reads_them(tmp_path):
    """Dots3NoteTextConfig's defaults (4 layers): its sliding-window layers are refused in one
    line; with `use_sliding_window` false, every layer indexed: the rotary base (80M), the
    norms' eps, the MLP kinds, the shared experts' width, GLM-5's indexer rotary, and
    transformers' own parameter count (meta device)."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(DOTS3))
    with pytest.raises(ValueError, match="Dots3 Note's sliding_attention layers are not") as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({**DOTS3, "use_sliding_window": False}))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    f, m = ours.family, ours.family.mla
    assert set(theirs.layer_types) == {"indexed_attention"}
    assert ours.rope_theta == theirs.rope_parameters["indexed_attention"]["rope_theta"] == 8e7
    assert m.dots and m.norm_eps == ours.rms_norm_eps == theirs.rms_norm_eps == 1e-5
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert f.shared_expert_intermediate_size == theirs.shared_experts_intermediate_size == 1536
    assert m.indexer.rope_interleave and m.indexer.full_layers == (True,) * 4
    assert f.attention_multiplier == pytest.approx((128 + 64) ** -0.5)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(theirs)
    assert ours.num_params == sum(p.numel() for p in hf.parameters())


def test_a_dots3_note_conditional_checkpoint_loads_its_text_model(built, tmp_path):
    """`Dots3NoteForConditionalGeneration` as transformers saves it: config.json's text model
    under `text_config` beside the vision and audio towers' configs, the text model's tensors
    under `model.` as the causal LM's (the towers' under `vision_encoder.` / `audio_encoder.`,
    not read): the text model is served, transformers' tokens and logits (checked once against
    transformers' conditional model on text alone, whose forward is its text model's)."""
    from arch_cases import check, generate
    from pagoda.runtime import LLM
    from pagoda.runtime.model.loader import load_model

    path, _, _, reference = built("dots3-top8")
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    text = json.loads((path / "config.json").read_text())
    wrapped = {"architectures": ["Dots3NoteForConditionalGeneration"], "model_type": "dots3_note",
               "text_config": text, "vision_config": {}, "audio_config": {}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(wrapped))
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "dots3_note_text"
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"dots3 conditional: prompt {i}")


def test_a_block_wise_fp8_release_loads_dequantized(built, tmp_path):
    """DeepSeek-V3.2's FP8 release format: the decoder's projections, the indexer's wq_b and wk
    among them, in E4M3 with a float32 `weight_scale_inv` per 32 x 32 tile (partial at the
    edges), weights_proj and the router in 16/32 bits: it loads dequantized and gives
    transformers' tokens and logits on the dequantized weights, sparse steps included."""
    from arch_cases import check, generate
    from fp8_testlib import write_blocks_of
    from hf_oracle import hf_greedy_plain
    from pagoda.runtime import LLM
    from pagoda.runtime.model.loader import load_model

    path = built("v32-top8")[0]
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [32, 32]}  # fmt: skip
    fp8 = ("proj.weight", "proj_with_mqa.weight", "wq_b.weight", "wk.weight")
    write_blocks_of(path, tmp_path, qc, (32, 32),
                    lambda n: n.endswith(fp8) and "weights_proj" not in n)  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized").eval()
    reference = [hf_greedy_plain(model, p, 6) for p in prompts()]
    loaded = load_model(str(tmp_path / "fp8"))
    assert loaded.fp8_scheme.block == (32, 32)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4, block_size=16)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"FP8 V3.2: prompt {i}")


@pytest.mark.parametrize(
    ("name", "change", "match"),
    [("glm5-top24", {"indexer_types": ["full", "full", "full"]},
      r"missing tensor 'model.layers.1.self_attn.indexer.wq_b.weight'"),
     ("glm5-top24", {"index_head_dim": 16},
      r"indexer.wq_b.weight is \[512, 24\], .* needs \[256, 24\]"),
     ("axk2-top8", {"gated_norm_rank": 4},
      r"input_layernorm.W_down.weight is \[8, 64\], .* needs \[4, 64\]"),
     ("axk2-top8", {"mlp_layer_types": ["sparse", "sparse"]},
      r"missing tensor 'model.layers.0.post_attention_layernorm.norm.weight'")],
    ids=["glm5-all-full", "glm5-head-dim", "axk2-gate-rank", "axk2-dense-made-sparse"],
)  # fmt: skip
def test_indexer_weights_the_config_does_not_match_are_refused_in_one_line(
    built, tmp_path, name, change, match
):
    """GLM-5's checkpoint read with a layer made 'full' that has no indexer (its shared layer),
    or another index_head_dim; A.X-K2's with another gate rank, or its dense layer made an
    expert layer (whose norm before the MLP is gated): one line naming the tensor."""
    from pagoda.runtime.model.loader import read_model_config

    path = built(name)[0]
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ValueError, match=match) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_transformers(built, name):
    """On CUDA (benchmarks/gpu_check.sh's `families` step): float32 with the defaults (the
    Triton attention for dense steps, the sparse steps in torch, eager: CUDA graphs are off for
    these models), transformers' tokens and logits cold and on a warm cache; no step's launch
    syncs with the host (`arch_cases.tokens_without_host_syncs`)."""
    import os

    from arch_cases import check, generate, tokens_without_host_syncs
    from pagoda.runtime import LLM

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs CUDA with compiled Triton kernels (TRITON_INTERPRET=0)")
    _, _, loaded, reference = built(name)
    common = dict(loaded=loaded, dtype="float32", kv_cache_memory=256 << 20,
                  max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    llm = LLM(**common)
    runner = llm.engine.runner
    assert runner.cuda_graphs is None and runner.backend.name == "triton"
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cuda, cold")
        check(warm[i], want, f"{name}: prompt {i}, cuda, warm")
    synced = tokens_without_host_syncs(LLM(**common, async_scheduling=False), prompts())
    assert synced == [t for t, _ in cold]
