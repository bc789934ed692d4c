"""Gemma 4's text model (`model/gemma4.py`) against transformers: tiny random checkpoints
mixing sliding and full-attention layers of other head sizes, with per-layer inputs, KV-shared
layers (k_eq_v, double-wide MLPs, fewer full-attention KV heads) or the MoE block; the engine's
greedy tokens and logits equal transformers' in a batch of unequal prompts, chunked, on a warm
prefix cache, preempted; the multimodal wrapper read text-only; published configs read as
transformers reads them; what is refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
from arch_cases import (
    built_fixture,
    check_chunked_cached_batched,
    check_preempted,
    check_two_ranks,
    generate,
    prompts,
)
from hf_oracle import hf_greedy_plain, randomize, save_tiny
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4TextConfig"):
    pytest.skip("transformers without Gemma 4", allow_module_level=True)

S, F = "sliding_attention", "full_attention"
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            layer_types=[S, F, S, F], sliding_window=9, max_position_embeddings=512,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=300, eos_token_id=2,
            bos_token_id=1, pad_token_id=0, final_logit_softcapping=6.0)  # fmt: skip
CASES = {
    # per-layer inputs, head sizes 16 (sliding) and 32 (full, proportional rotary on 1/4)
    "ple": {},
    # the last two layers read layers 0 and 1's KV (keys as values in the full layers, one KV
    # head there), their MLPs double wide; SiLU for GeGLU's gelu (MLPs, per-layer gates)
    "kv-shared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=True,
                      num_global_key_value_heads=1, hidden_activation="silu"),
    # the MoE block beside every MLP, no per-layer inputs
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16,
                hidden_size_per_layer_input=0, num_hidden_layers=3, layer_types=[S, S, F]),
    # Gemma 4 Unified (Gemma4UnifiedForCausalLM): no per-layer inputs nor MoE block; KV-shared
    # layers with keys as values (one full-attention KV head), double-wide MLPs
    "unified": dict(num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=True,
                    num_global_key_value_heads=1),
}  # fmt: skip
_NO_PLE = ("hidden_size_per_layer_input", "vocab_size_per_layer_input")  # (not Unified's keys)
# over two ranks: the kv-shared case (the full layers' one KV head replicated on both ranks, the
# sliding layers' two split, the shared layers reading their own rank's cache rows) with the MoE
# block beside every MLP (experts split by width); per-layer inputs replicated
TWO_RANKS = {**CASES["kv-shared"], "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
             "moe_intermediate_size": 16}  # fmt: skip


def _scaled(model):
    """Randomized as `make_tiny_model`'s; each layer's scalar its own."""
    randomize(model)
    with torch.no_grad():
        layers = getattr(model.model, "language_model", model.model).layers
        for i, layer in enumerate(layers):
            layer.layer_scalar.fill_(0.8 + 0.15 * i)
    return model


def write(name: str, path):
    torch.manual_seed(0)
    if name == "unified":
        text = {k: v for k, v in {**TEXT, **CASES[name]}.items() if k not in _NO_PLE}
        config = transformers.Gemma4UnifiedTextConfig(**text)
        return save_tiny(_scaled(transformers.Gemma4UnifiedForCausalLM(config).eval()), path)
    config = transformers.Gemma4TextConfig(**{**TEXT, **{**CASES, "two-ranks": TWO_RANKS}[name]})
    return save_tiny(_scaled(transformers.Gemma4ForCausalLM(config).eval()), path)


built = built_fixture(write)


@pytest.mark.parametrize("name", list(CASES))
def test_gemma4_matches_transformers_chunked_batched_and_cached(built, name):
    _, _, loaded, reference = built(name)
    check_chunked_cached_batched(loaded, reference, name)


@pytest.mark.parametrize("name", list(CASES))
def test_the_checked_tensors_are_the_checkpoints_and_sized_from_the_config(built, name):
    """`gemma4_config.expected_shapes` names every tensor transformers saved, with its shape
    (none the model would leave unread), the weights estimate from config.json alone
    (`server/weights.from_shapes`) is their bytes, and the estimate from the checkpoint's
    metadata is what the built model holds in bf16 (the MoE block's float32 norms and the
    unweighted norms' weights made at load too), on one rank and on rank 0 of two (its heads
    and KV heads by layer, its MLP and experts' rows)."""
    from model_bytes import check_estimate
    from pagoda.runtime.model.checkpoint_shapes import expected_shapes
    from pagoda.runtime.server.weights import from_shapes
    from safetensors import safe_open

    path, _, loaded, _ = built(name)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        stored = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118
    assert expected_shapes(loaded.config) == stored
    size = sum(math.prod(s) for s in stored.values())
    assert from_shapes(loaded.config, torch.float32, False) == 4 * size
    check_estimate(path, rel=1e-3)
    check_estimate(path, 2, rel=1e-3)


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache (`TWO_RANKS`): rank 0 holds one of the sliding layers' two KV heads."""
    path, _, loaded, reference = built("two-ranks")
    check_two_ranks(path, loaded, reference, "gemma4 two ranks", kv_heads=1)


def test_kv_shared_layers_keep_no_pages_and_survive_preemption(built):
    """Layers 2 and 3 read layers 0 and 1's caches (the same tensors): the pool holds two
    layers, one of head size 16 and 2 KV heads, one of 32 and 1; preempted requests still
    decode transformers' tokens."""
    _, _, loaded, reference = built("kv-shared")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=4 << 20, block_size=16)
    runner = llm.engine.runner
    caches = runner.kv_caches
    assert len(runner.model.kv_backends) == 2
    assert caches[2] is caches[0] and caches[3] is caches[1]
    assert runner.bytes_per_block == 16 * 2 * 4 * (2 * 16 + 1 * 32)
    check_preempted(loaded, reference, "kv-shared")


def test_a_conditional_generation_checkpoint_is_read_text_only(tmp_path):
    """Gemma4ForConditionalGeneration with a vision tower: the text model under
    `model.language_model.`, the tower and its embedder not read; transformers' tokens."""
    torch.manual_seed(0)
    vision = transformers.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, head_dim=16,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=2)  # fmt: skip
    text = transformers.Gemma4TextConfig(**{**TEXT, **CASES["kv-shared"]})
    cfg = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    model = save_tiny(_scaled(transformers.Gemma4ForConditionalGeneration(cfg).eval()), tmp_path)
    reference = [hf_greedy_plain(model, p, 6) for p in prompts()]
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "gemma4"
    llm = LLM(
        loaded=loaded,
        dtype="float32",
        kv_cache_memory=16 << 20,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    got = generate(llm, prompts())
    assert [t for t, _ in got] == [t for t, _ in reference]


def test_a_unified_conditional_generation_checkpoint_is_read_text_only(tmp_path):
    """Gemma4UnifiedForConditionalGeneration with its vision and audio embedders (no towers):
    the text model under `model.language_model.`, the embedders not read; transformers'
    tokens."""
    torch.manual_seed(0)
    vision = transformers.Gemma4UnifiedVisionConfig(patch_size=2, pooling_kernel_size=1,
                                                    mm_embed_dim=16, mm_posemb_size=8)  # fmt: skip
    audio = transformers.Gemma4UnifiedAudioConfig(audio_embed_dim=16)
    text = {k: v for k, v in {**TEXT, **CASES["unified"]}.items() if k not in _NO_PLE}
    cfg = transformers.Gemma4UnifiedConfig(
        text_config=transformers.Gemma4UnifiedTextConfig(**text), vision_config=vision,
        audio_config=audio,
    )  # fmt: skip
    model = transformers.Gemma4UnifiedForConditionalGeneration(cfg).eval()
    model = save_tiny(_scaled(model), tmp_path)
    reference = [hf_greedy_plain(model, p, 6) for p in prompts()]
    loaded = load_model(str(tmp_path))
    assert loaded.config.architecture == "gemma4_unified"
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    got = generate(llm, prompts())
    assert [t for t, _ in got] == [t for t, _ in reference]


def test_a_sparse_unified_config_reads_as_transformers_reads_it(tmp_path):
    """Gemma4UnifiedTextConfig's defaults where config.json leaves them out (a 1024-key window,
    5 sliding : 1 full, 512-wide full-attention heads); per-layer-input and MoE keys, which its
    model never builds, do not make them."""
    text = {"model_type": "gemma4_unified_text", "hidden_size": 64, "intermediate_size": 96,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 6,
            "head_dim": 16, "vocab_size": 300, "hidden_size_per_layer_input": 8,
            "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
            "moe_intermediate_size": 16}  # fmt: skip
    top = {"architectures": ["Gemma4UnifiedForConditionalGeneration"],
           "model_type": "gemma4_unified", "text_config": text}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = read_model_config(str(tmp_path))
    g, n = ours.family.gemma4, theirs.num_hidden_layers
    assert ours.architecture == "gemma4_unified"
    assert list(g.head_dims) == [theirs.per_layer_config[i].head_dim for i in range(n)]
    assert [ours.family.window(i) for i in range(n)] == [
        theirs.sliding_window if t == S else None for t in theirs.layer_types
    ]
    assert ours.max_position_embeddings == theirs.max_position_embeddings == 262_144
    assert g.per_layer_input == 0 and g.num_experts == 0


# google/gemma-4-E2B-it's text_config shrunk (35 layers of 4 sliding : 1 full, head sizes 256
# and 512, 20 KV-shared layers with double-wide MLPs, per-layer inputs), 31B's (keys as values,
# 4 global KV heads, no per-layer inputs) and 26B-A4B's (the MoE block): the published keys
E2B = {"use_bidirectional_attention": "vision", "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
       "num_key_value_heads": 1, "num_hidden_layers": 10, "head_dim": 16, "global_head_dim": 32,
       "num_global_key_value_heads": None, "attention_k_eq_v": False, "sliding_window": 512,
       "vocab_size": 300, "vocab_size_per_layer_input": 300, "hidden_size_per_layer_input": 8,
       "num_kv_shared_layers": 4, "use_double_wide_mlp": True, "final_logit_softcapping": 30.0,
       "layer_types": ([S] * 4 + [F]) * 2, "model_type": "gemma4_text",
       "rope_parameters": {F: {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
                           S: {"rope_theta": 10000.0, "rope_type": "default"}}}  # fmt: skip
DENSE_31B = {**E2B, "attention_k_eq_v": True, "num_global_key_value_heads": 2,
             "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0,
             "use_double_wide_mlp": False, "layer_types": ([S] * 5 + [F]) * 2,
             "num_hidden_layers": 12}  # fmt: skip
MOE_26B = {**DENSE_31B, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2,
           "moe_intermediate_size": 24}  # fmt: skip


@pytest.mark.parametrize("text", [E2B, DENSE_31B, MOE_26B], ids=["e2b", "31b", "26b-a4b"])
def test_published_gemma4_configs_read_as_transformers_reads_them(tmp_path, text):
    top = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
           "text_config": text, "eos_token_id": [1, 106]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(top))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).get_text_config()
    ours = read_model_config(str(tmp_path))
    g, n = ours.family.gemma4, theirs.num_hidden_layers
    assert ours.architecture == "gemma4" and ours.num_layers == n
    layers = [theirs.per_layer_config[i] for i in range(n)]
    assert list(g.head_dims) == [c.head_dim for c in layers]
    assert list(g.kv_heads) == [c.num_key_value_heads for c in layers]
    modes = theirs.kv_sharing_modes
    assert [g.shares_kv(i) for i in range(n)] == [m == "reuse" for m in modes]
    for i in range(n):  # a shared layer reads the last earlier layer of its kind that stores
        if g.shares_kv(i):
            src = g.kv_source[i]
            assert modes[src] == "store" and theirs.layer_types[src] == theirs.layer_types[i]
    assert [ours.family.window(i) is not None for i in range(n)] == [
        t == S for t in theirs.layer_types
    ]
    assert g.per_layer_input == (theirs.hidden_size_per_layer_input or 0)
    double = [theirs.use_double_wide_mlp and m == "reuse" for m in modes]
    assert list(g.mlp_widths) == [theirs.intermediate_size * (2 if d else 1) for d in double]
    assert list(g.k_eq_v) == [theirs.attention_k_eq_v and t == F for t in theirs.layer_types]
    assert g.num_experts == (theirs.num_experts if theirs.enable_moe_block else 0)
    assert ours.family.final_logit_softcapping == theirs.final_logit_softcapping
    assert set(ours.eos_token_ids) == {1, 106}
    assert ours.kv_layer_shapes == tuple(
        (c.num_key_value_heads, c.head_dim) for c, m in zip(layers, modes) if m != "reuse"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"per_layer_config": {"1": {"intermediate_size": 8}}}, "per_layer_config"),
        ({"rope_parameters": {S: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}},
         "rope_type"),
        ({"vocab_size_per_layer_input": 100}, "vocab_size_per_layer_input"),
    ],
)  # fmt: skip
def test_what_gemma4_does_not_compute_is_refused_in_one_line(tmp_path, change, message):
    cfg = {**E2B, **change, "architectures": ["Gemma4ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        read_model_config(str(tmp_path))


def _config(tmp_path, text):
    (tmp_path / "config.json").write_text(
        json.dumps({**text, "architectures": ["Gemma4ForCausalLM"]})
    )
    return read_model_config(str(tmp_path))


@pytest.mark.parametrize(("change", "message"), [
    ({"num_attention_heads": 6, "num_global_key_value_heads": 3}, "layer 5's 3 KV heads can neither be split over 2"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
      "moe_intermediate_size": 25}, "experts' width \\(moe_intermediate_size 25\\)"),
], ids=["global-kv-heads", "experts-width"])  # fmt: skip
def test_gemma4_layers_that_two_ranks_cannot_split_are_refused_in_one_line(
    tmp_path, change, message
):
    """The full-attention layers' own KV heads and the experts' width must split (or the KV
    heads replicate); the published shapes do (`DENSE_31B`, `MOE_26B` shrunk)."""
    from pagoda.runtime.distributed.layout import check

    for ok in (E2B, DENSE_31B, MOE_26B):
        check(_config(tmp_path, ok), 2)
    with pytest.raises(ValueError, match=message):
        check(_config(tmp_path, {**DENSE_31B, **change}), 2)


def test_gemma4_fp8_is_refused(tmp_path):
    from types import SimpleNamespace

    from pagoda.runtime.engine.start_checks import check_dtype

    mc = _config(tmp_path, E2B)
    with pytest.raises(ValueError, match="fp8 is not supported for a gemma4"):
        # (an EngineConfig refuses fp8 on this CPU itself: the flag as a GPU's would read)
        check_dtype(SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16), mc)


@pytest.mark.skipif(
    __import__("os").environ.get("TRITON_INTERPRET") != "1",
    reason="CPU run of Triton kernels needs TRITON_INTERPRET=1",
)
def test_gemma4_on_the_triton_backend_matches_transformers(built):
    """Both head sizes' Triton backends, the shared layers attending without storing, chunked
    and batched, two prompts past the window, not batch-invariant (the sliding layers' rows in
    the prefill kernel, the full layers' prompt rows through SDPA with the producers' k/v,
    decodes in the decode kernel): transformers' tokens and logits."""
    pytest.importorskip("triton")
    from arch_cases import check_on_triton

    _, model, loaded, _ = built("kv-shared")
    check_on_triton(model, loaded, (19, 12), "kv-shared")


def test_a_gemma4_too_big_for_its_gpu_is_offered_more_gpus_not_fp8(tmp_path, monkeypatch):
    """google/gemma-4-E2B's text model (its per-layer table: 2.35B of its parameters) on a GPU
    of 8 GiB: refused with its size counted from the config; FP8 (refused) not offered, four
    ranks are (the per-layer table whole on each: two do not hold it)."""
    from pagoda.runtime import config
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import fit, memory
    from pagoda.runtime.termination import ReasonedError

    monkeypatch.setattr(memory, "device_available", lambda d: (8 << 30, 8 << 30))
    monkeypatch.setattr(fit, "fp8_runs_on", lambda d: d.type == "cuda")
    monkeypatch.setattr(config, "fp8_runs_on", lambda d: d.type == "cuda")
    e2b = {**E2B, "hidden_size": 1536, "intermediate_size": 6144, "num_attention_heads": 8,
           "num_hidden_layers": 35, "head_dim": 256, "global_head_dim": 512,
           "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
           "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 20,
           "layer_types": ([S] * 4 + [F]) * 7, "architectures": ["Gemma4ForCausalLM"]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(e2b))
    mc = read_model_config(str(tmp_path))
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, EngineConfig.create("m", device="cuda", max_model_len=8192), tmp_path)
    msg = str(err.value)
    assert msg.startswith("the model (4.6B parameters) needs 8.8 GiB: weights 8.6 GiB"), msg
    assert "--quantization fp8" not in msg, msg
    assert msg.endswith("would fit: --tensor-parallel-size 4 (5.7 GiB per GPU)"), msg
