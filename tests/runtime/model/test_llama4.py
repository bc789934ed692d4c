"""Llama 4's text model (`Llama4ForCausalLM`, and `Llama4ForConditionalGeneration`'s language
model) against transformers, token for token and logits within 1e-3 (float32), on tiny random
checkpoints transformers writes itself: prompts chunked into 16-token steps, three prompts
sharing steps, a warm prefix cache, and a pool small enough to preempt.

- scout-like: experts in every layer (top-1 sigmoid scaling the expert's input, a shared
  expert), every other layer NoPE with attention temperature tuning (floor_scale small enough
  that the q scale changes within the prompts), L2 q/k norms on the rotary layers, the
  interleaved (complex) rotary with llama3 scaling;
- maverick-like: experts every second layer (dense MLPs of intermediate_size_mlp between), no
  q/k norm, no temperature tuning; top-2 routing (released checkpoints are top-1, transformers
  runs k > 1: each pick's sigmoid scales its own copy of the token before its expert, the
  outputs summed).

Chunked attention on the rotary layers with tiny chunks (8 and 12 tokens: the prompts and
their 16-token prefill steps cross several chunks, at and off block edges, through a warm
prefix cache, batching and preemption), the NoPE layers attending to everything; the context is
max_position_embeddings, no longer one chunk. Also: two tensor-parallel ranks, the weights
estimate, and what the checks refuse.
"""

from __future__ import annotations

import pytest
import torch
from arch_cases import (
    built_fixture,
    case_fixture,
    check,
    check_chunked_cached_batched,
    generate,
    gpu_test,
    greedy_test,
    prompts,
)
from hf_oracle import _LM_CLASSES, TINY, hf_greedy_plain, make_tiny_model, make_tiny_wrapped
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
_LM_CLASSES.setdefault("Llama4Text", "Llama4ForCausalLM")
NEW = 6
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
CASES = {
    "scout": dict(num_local_experts=4, num_experts_per_tok=1, intermediate_size=32,
                  intermediate_size_mlp=96, num_hidden_layers=4, head_dim=16,
                  no_rope_layer_interval=2, interleave_moe_layer_step=1, use_qk_norm=True,
                  attn_temperature_tuning=True, floor_scale=8, attn_scale=0.5,
                  attention_chunk_size=8, rope_parameters=LLAMA3),
    "maverick": dict(num_local_experts=6, num_experts_per_tok=2, intermediate_size=32,
                     intermediate_size_mlp=96, num_hidden_layers=4, head_dim=16,
                     no_rope_layer_interval=4, interleave_moe_layer_step=2, use_qk_norm=False,
                     attn_temperature_tuning=False, attention_chunk_size=12),
}  # fmt: skip


# maverick's layers one of each: a chunked rotary layer, then a NoPE global one with the experts
# (the Triton test's model: one layer in the Triton kernels where maverick has three)
MAVERICK_2 = dict(CASES["maverick"], num_hidden_layers=2, no_rope_layer_interval=2)
built = built_fixture(
    lambda name, path: make_tiny_model(
        path, "Llama4Text", **(MAVERICK_2 if name == "maverick-2" else CASES[name])
    )
)


case = case_fixture(CASES)
test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.slow  # ~5 s
def test_the_cpu_backends_torch_path_masks_the_chunks(built, monkeypatch):
    """The CPU backend's torch path (`PAGODA_CPU_ATTENTION=torch`: buckets and masks planned
    per step, a chunked layer's keys from its first query's chunk on), chunked, batched, on a
    warm cache; the C++ kernel's path is the default the tests above run."""
    from pagoda.runtime.cpu import attention as cpu_attention

    monkeypatch.setenv(cpu_attention.ENV_SWITCH, "torch")
    _, _, loaded, reference = built("maverick")
    llm = check_chunked_cached_batched(loaded, reference, "maverick, torch path")
    assert llm.engine.runner.backend.kernel is None


def test_the_cuda_expert_paths_route_top_k_as_transformers(built):
    """The experts' CUDA paths on the CPU (the stacked [E, 2N, K] / [E, K, N] weights: every
    expert over every token where the fused kernel cannot be imported, and the fused kernel's
    torch reference): top-2, each pick's own scaled row, against transformers' Llama4TextMoe
    and the CPU path."""
    from pagoda.kernels import fused_moe_reference

    _, model, loaded, _ = built("maverick")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=4 << 20)
    moe = llm.engine.runner.model.layers[1].mlp
    theirs = model.model.layers[1].feed_forward
    x = torch.randn(7, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = theirs(x)[0]
        torch.testing.assert_close(moe(x), want, rtol=1e-4, atol=1e-4)
        s = moe.experts
        s.w13 = theirs.experts.gate_up_proj.transpose(1, 2).contiguous()  # gate rows, then up
        s.w2 = theirs.experts.down_proj.transpose(1, 2).contiguous()
        for s.fused in (None, fused_moe_reference.fused_experts):
            torch.testing.assert_close(moe(x), want, rtol=1e-4, atol=1e-4, msg=str(s.fused))


@pytest.mark.slow  # Triton's interpreter: ~7 s (maverick's four layers took 3.2x as long)
def test_the_triton_backend_masks_the_chunks(built):
    """The Triton kernels (Triton's interpreter on a CPU, the GPU where there is one) not
    batch-invariant: the decodes in the split-KV kernel, the chunked layers' prompt rows in the
    prefill kernel, the NoPE layer's through SDPA (the batch-invariant path, every row in the
    prefill kernel, is the gpu test's; each path against the reference:
    tests/kernels/test_kernel_attention.py); chunked, batched and on a warm cache:
    transformers' tokens and logits. On MAVERICK_2: one layer of each kind (a chunked one in
    the Triton kernels, a NoPE one), each kind's paths as maverick's four layers run them."""
    import os

    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernels run on a CPU under TRITON_INTERPRET=1 only")
    name = "maverick-2"
    _, _, loaded, reference = built(name)
    f = loaded.config.family
    assert f.chunk_layers == f.rope_layers == (True, False) and f.moe_layers == (False, True)
    llm = LLM(loaded=loaded, attention_backend="triton", dtype="float32",
              kv_cache_memory=16 << 20, max_num_batched_tokens=16, max_num_seqs=4,
              batch_invariant=False)  # fmt: skip
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, triton, cold")
        check(warm[i], want, f"{name}: prompt {i}, triton, warm")
    assert llm.engine.kv.prefix_hits > 0


def test_config_reads_as_transformers_and_the_context_is_max_position_embeddings(built):
    """Rotary, chunked and expert layers as transformers derives them; the context is
    max_position_embeddings (512), past the attention chunk (12): 512 is served, 513 refused;
    the chunked layers pass their chunk to the backend, the NoPE layer none; the rotary table
    holds the positions served (Scout's 10M would be 5.4 GB)."""
    from pagoda.runtime.config import EngineConfig

    path, _, loaded, _ = built("maverick")
    hf = transformers.AutoConfig.from_pretrained(path)
    f = read_model_config(str(path)).family
    assert list(f.rope_layers) == [bool(x) for x in hf.no_rope_layers] == [True] * 3 + [False]
    assert [i for i, m in enumerate(f.moe_layers) if m] == hf.moe_layers == [1, 3]
    assert [f.chunk(i) for i in range(4)] == [12, 12, 12, None]
    assert [t == "chunked_attention" for t in hf.layer_types] == list(f.chunk_layers)
    c = read_model_config(str(path))
    assert c.context_length == 512 and c.intermediate_size == 96
    assert c.family.moe_intermediate_size == 32
    with pytest.raises(ValueError, match="context length \\(512 tokens, from its metadata"):
        LLM(loaded=loaded, dtype="float32", max_model_len=513, kv_cache_memory=16 << 20)
    assert EngineConfig.create(str(path), device="cpu", max_model_len=512)
    llm = LLM(loaded=loaded, dtype="float32", max_model_len=96, kv_cache_memory=16 << 20)
    model = llm.engine.runner.model
    assert [layer.chunk for layer in model.layers] == [12, 12, 12, None]
    assert model.rope_caches["global"].shape[0] == 96  # the positions served, not 512


def test_layer_types_name_the_chunked_layers():
    """`layer_types` where config.json gives it: its chunked layers, not the rotary ones; a
    chunked layer without an attention_chunk_size is refused with one line."""
    from pagoda.runtime.model.llama4_config import family_fields, overrides

    cfg = dict(num_hidden_layers=4, no_rope_layer_interval=4, interleave_moe_layer_step=1,
               num_experts_per_tok=1, num_local_experts=4, intermediate_size=32,
               intermediate_size_mlp=96, use_qk_norm=True, attn_temperature_tuning=True,
               floor_scale=8, attn_scale=0.1, attention_chunk_size=16,
               layer_types=["chunked_attention", "full_attention"] * 2)  # fmt: skip
    f = family_fields({**cfg, **overrides(cfg)}, 4)
    assert f["chunk_layers"] == (True, False, True, False) and f["attention_chunk_size"] == 16
    with pytest.raises(ValueError, match="without a positive attention_chunk_size"):
        family_fields({**cfg, **overrides(cfg), "attention_chunk_size": None}, 4)
    assert "chunk_layers" not in family_fields({**cfg, **overrides(cfg), "layer_types": None,
                                                "attention_chunk_size": None}, 4)  # fmt: skip


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_estimate_is_what_the_model_holds(built, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: the stacked
    experts (split by width over two ranks), the router, the shared expert, the dense MLPs."""
    from model_bytes import check_estimate

    path, _, _, _ = built("maverick")
    check_estimate(path, tp)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_tensor_parallel_ranks_match_transformers(built):
    """Heads split over two ranks (each rank's q/k L2-normed and temperature-scaled), the
    stacked experts and the shared expert by width, the router whole: transformers' tokens and
    logits, chunked, preempted and on a warm cache."""
    path, _, loaded, reference = built("scout")
    pool = dict(num_blocks_override=7, block_size=16, max_model_len=96, dtype="float32",
                max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **pool) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        assert core.runner.backend.num_kv_heads == 1  # this rank's
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"scout: prompt {i}, two ranks")


def test_the_multimodal_checkpoints_language_model(tmp_path):
    """`Llama4ForConditionalGeneration` (Scout's and Maverick's published class): its
    `text_config` and its `language_model.` weights are read, the vision tower's are not; text
    prompts give transformers' tokens and logits."""
    text = dict(TINY, intermediate_size=32, intermediate_size_mlp=96, head_dim=16,
                num_local_experts=4, attention_chunk_size=16, no_rope_layer_interval=2,
                floor_scale=8, pad_token_id=0)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14, vision_output_dim=32,
                  projector_input_dim=32, projector_output_dim=32)  # fmt: skip
    config = transformers.Llama4Config(text_config=text, vision_config=vision)
    model = make_tiny_wrapped(tmp_path, "Llama4ForConditionalGeneration", config, seed=None)
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    loaded = load_model(str(tmp_path))
    assert not any(n.startswith("vision_model") for n in loaded.weights)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"multimodal: prompt {i}")


def test_scouts_hub_config_reads_as_transformers_reads_it(tmp_path):
    """Llama-4-Scout's config.json (a config alone, no weights): the multimodal wrapper's
    text_config with the older `rope_scaling` (llama3, original context 8192), an empty
    `no_rope_layers` (the default: every fourth layer NoPE), experts in every layer; chunks of
    8192 on the rotary layers (transformers' layer_types); the context is
    max_position_embeddings' 10M."""
    import json

    text = {"attention_chunk_size": 8192, "attn_scale": 0.1, "attn_temperature_tuning": True,
            "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
            "interleave_moe_layer_step": 1, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "max_position_embeddings": 10485760,
            "model_type": "llama4_text", "no_rope_layers": [], "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
            "num_local_experts": 16, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "use_qk_norm": True, "vocab_size": 202048, "eos_token_id": [200001, 200007, 200008]}  # fmt: skip
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
           "text_config": text, "tie_word_embeddings": False}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).text_config
    ours = read_model_config(str(tmp_path))
    assert list(ours.family.rope_layers) == [bool(x) for x in theirs.no_rope_layers]
    assert ours.family.rope_layers[:4] == (True, True, True, False)
    assert all(ours.family.moe_layers) and len(theirs.moe_layers) == 48
    assert ours.rope_scaling["rope_type"] == theirs.rope_parameters["rope_type"] == "llama3"
    assert ours.rope_scaling["factor"] == 16.0 and ours.rope_theta == 500000.0
    assert ours.context_length == 10485760 and ours.intermediate_size == 16384
    assert ours.family.attention_chunk_size == 8192
    assert list(ours.family.chunk_layers) == [t == "chunked_attention" for t in theirs.layer_types]
    assert ours.eos_token_ids == (200001, 200007, 200008) and not ours.tie_word_embeddings


def _every_moe_fused(name, runner):
    moes = [layer.mlp for layer in runner.model.layers if hasattr(layer.mlp, "experts")]
    assert moes and all(m.experts.fused is not None for m in moes), name


# On CUDA (benchmarks/gpu_check.sh's `families` step): the experts in the fused-MoE kernel,
# decodes in CUDA graphs, eager as graphs, no host sync in a step's launch
test_gpu_matches_transformers_with_graphs = gpu_test(_every_moe_fused)
