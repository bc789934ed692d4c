"""What real checkpoints vary in config.json, against transformers token for token: RoPE
scalings (llama3, yarn with DeepSeek's mscale and without truncation), Gemma 3's window layers
with their own rotary base in `rope_parameters`, a multimodal Gemma 3 whose top-level
`tie_word_embeddings` says untied, Qwen3-MoE's window (every layer, whatever max_window_layers
says); and what the engine cannot run exactly, refused at load in one line (an unknown rope
type, a partial rotary outside Phi-3, longrope factors of the wrong length, dynamic NTK past the
model's context, Gemma 3's bidirectional attention, experts with
another activation than SwiGLU)."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import FULL, NEW, SLIDING, check, generate
from hf_oracle import TINY, hf_greedy_plain, make_tiny_model, save_multimodal_gemma3
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")
# the tiny checkpoints' shape without its token ids and context (the multimodal configs' own)
SHAPE = {k: TINY[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads")}  # fmt: skip
LONG = [(7 * i + 3) % 290 + 5 for i in range(70)]
PROMPTS = [LONG, [(5 * i + 1) % 290 + 5 for i in range(23)]]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "rope_theta": 10000.0}  # fmt: skip
CASES = {
    "llama3-rope": ("Llama", dict(rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32, "rope_theta": 500000.0})),
    "yarn-mscale": ("Llama", dict(rope_parameters={
        **YARN, "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2})),
    "yarn-untruncated": ("Qwen3", dict(head_dim=32, rope_parameters={**YARN, "truncate": False})),
    "gemma3-local-theta": ("Gemma3Text", dict(
        head_dim=32, sliding_window=7, num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING],
        rope_parameters={FULL: {**YARN, "rope_theta": 100000.0},
                         SLIDING: {"rope_type": "default", "rope_theta": 500.0}})),
    # GeGLU named by a family other than Gemma's (it ran SiLU)
    "llama-gelu-tanh": ("Llama", dict(hidden_act="gelu_pytorch_tanh")),
    # transformers windows every Qwen3-MoE layer when use_sliding_window, max_window_layers or not
    "qwen3moe-window-every-layer": ("Qwen3Moe", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, use_sliding_window=True,
        sliding_window=12, max_window_layers=1)),
}  # fmt: skip


def _engine(loaded) -> LLM:
    return LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, block_size=16,
               max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_config_variants_match_transformers(tmp_path, name):
    arch, overrides = CASES[name]
    model = make_tiny_model(tmp_path, arch, **overrides)
    want = [hf_greedy_plain(model, p, NEW) for p in PROMPTS]
    got = generate(_engine(load_model(str(tmp_path))), PROMPTS)
    for i, (g, w) in enumerate(zip(got, want)):
        check(g, w, f"{name}: prompt {i}")


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# config.json as older checkpoints write it (rope_theta / rope_scaling, edited in after saving):
# transformers takes a top-level original_max_position_embeddings over rope_scaling's and,
# without either, the model's context (not 8192)
LEGACY_ROPE = {
    "llama3-without-original-context": (
        dict(max_position_embeddings=100), dict(rope_scaling=LLAMA3, rope_theta=500000.0)),
    "llama3-top-level-original-context": (dict(), dict(
        rope_scaling={**LLAMA3, "original_max_position_embeddings": 256}, rope_theta=500000.0,
        original_max_position_embeddings=16)),
    "yarn-top-level-original-context": (dict(max_position_embeddings=256), dict(
        rope_scaling={"type": "yarn", "factor": 4.0}, original_max_position_embeddings=16)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(LEGACY_ROPE))
def test_legacy_rope_fields_read_as_transformers_reads_them(tmp_path, name):
    overrides, fields = LEGACY_ROPE[name]
    make_tiny_model(tmp_path, "Llama", **overrides)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_theta": 10000.0, **fields}))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    want = [hf_greedy_plain(model.eval(), p, NEW) for p in PROMPTS]
    got = generate(_engine(load_model(str(tmp_path))), PROMPTS)
    for i, (g, w) in enumerate(zip(got, want)):
        check(g, w, f"{name}: prompt {i}")


FAMILIES = {"Llama": {}, "Mistral": {}, "Qwen2": {}, "Qwen3": {}, "Gemma3Text": {},
            "Mixtral": {}, "Qwen3Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
            "Qwen2Moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=48),
            "Olmo2": {}, "Granite": {}, "GraniteMoe": {},
            "Olmoe": dict(num_experts=8, intermediate_size=32)}  # fmt: skip


def _without_defaults(path, arch: str) -> None:
    """Leave out of config.json every field equal to transformers' default for `arch`."""
    default = getattr(transformers, f"{arch}Config")().to_dict()
    cfg = json.loads((path / "config.json").read_text())
    keep = ("architectures", "model_type")
    cfg = {k: v for k, v in cfg.items() if k in keep or k not in default or default[k] != v}
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_fields_a_config_leaves_out_take_transformers_defaults(tmp_path, arch):
    """Mixtral's rotary base (1e6) and norm epsilon (1e-5), Mistral's window (4096), the
    families' contexts and KV heads, as transformers reads the same config.json."""
    make_tiny_model(tmp_path, arch, **FAMILIES[arch])
    _without_defaults(tmp_path, arch)
    hf, ours = transformers.AutoConfig.from_pretrained(tmp_path), read_model_config(str(tmp_path))
    rope = hf.rope_parameters.get(FULL, hf.rope_parameters)
    window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", 1) else None
    assert (ours.rope_theta, ours.rms_norm_eps, ours.num_kv_heads, ours.head_dim,
            ours.max_position_embeddings, ours.family.sliding_window) == (
        rope["rope_theta"], hf.rms_norm_eps, hf.num_key_value_heads,
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        hf.max_position_embeddings, window)  # fmt: skip
    d = ours.head_dim  # Granite's softmax scale: attention_multiplier (default 1), not d^-1/2
    assert ours.family.attention_scale(d) == getattr(hf, "attention_multiplier", d**-0.5)
    assert ours.family.norm_topk_prob == getattr(hf, "norm_topk_prob", True)  # Mixtral: True


def test_mixtral_without_its_default_fields_matches_transformers(tmp_path):
    make_tiny_model(tmp_path, "Mixtral", num_local_experts=4)
    _without_defaults(tmp_path, "Mixtral")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    want = hf_greedy_plain(model.eval(), PROMPTS[1], NEW)
    check(generate(_engine(load_model(str(tmp_path))), PROMPTS[1:])[0], want, "sparse Mixtral")


def test_gemma3_layer_pattern_as_transformers_reads_it(tmp_path):
    """Without `layer_types`, `sliding_window_pattern` (default 6) places the global layers;
    the `_sliding_window_pattern` transformers writes beside `layer_types` is not read."""
    make_tiny_model(tmp_path, "Gemma3Text", head_dim=16, sliding_window=5, num_hidden_layers=4)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("layer_types")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "_sliding_window_pattern": 2}))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert model.config.layer_types == [SLIDING] * 4
    want = hf_greedy_plain(model.eval(), LONG, NEW)
    check(generate(_engine(load_model(str(tmp_path))), [LONG])[0], want, "pattern")


def test_qwen2moe_window_layers_as_transformers_places_them(tmp_path):
    """Without `layer_types`, Qwen2-MoE's `use_sliding_window` windows every other layer below
    `max_window_layers` (transformers 5), unlike Qwen2's layers from it on."""
    make_tiny_model(tmp_path, "Qwen2Moe", num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=32,
                    use_sliding_window=True, sliding_window=9, max_window_layers=2)  # fmt: skip
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("layer_types")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert model.config.layer_types == [SLIDING, FULL]
    loaded = load_model(str(tmp_path))
    assert loaded.config.family.window_layers == (True, False)
    want = hf_greedy_plain(model.eval(), LONG, NEW)
    check(generate(_engine(loaded), [LONG])[0], want, "Qwen2-MoE windows")


def test_mistral_window_null_is_none(tmp_path):
    make_tiny_model(tmp_path, "Mistral", sliding_window=None)
    assert transformers.AutoConfig.from_pretrained(tmp_path).sliding_window is None
    assert read_model_config(str(tmp_path)).family.sliding_window is None


def test_multimodal_gemma3_untied_by_its_top_level_flag(tmp_path):
    text = dict(SHAPE, head_dim=32, sliding_window=7, sliding_window_pattern=2)  # tied: default
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)  # fmt: skip
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=299, boi_token_index=297,
                                    eoi_token_index=298, tie_word_embeddings=False)  # fmt: skip
    model = save_multimodal_gemma3(tmp_path, cfg)
    loaded = load_model(str(tmp_path))
    assert not loaded.config.tie_word_embeddings
    want = []
    ids = list(PROMPTS[1])
    with torch.no_grad():
        for _ in range(NEW):
            want.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            ids.append(want[-1])
    assert generate(_engine(loaded), [PROMPTS[1]])[0][0] == want


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"rope_type": "proportional", "factor": 2.0}, "rope_scaling type 'proportional' is not "
         "supported"),
        # transformers' Llama rotates every dim (its apply_rotary_pos_emb has no pass-through)
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial rotary .* for llama"),
        ({"rope_type": "longrope", "short_factor": [1.0] * 7, "long_factor": [2.0] * 8,
          "original_max_position_embeddings": 32}, "short_factor: 8 numbers"),
    ],
)  # fmt: skip
def test_rope_the_engine_cannot_run_is_refused_at_load(tmp_path, rope, match):
    make_tiny_model(tmp_path, "Llama")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["rope_parameters"] = {**rope, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        read_model_config(str(tmp_path))


def test_dynamic_rope_is_exact_within_its_context_and_refused_past_it(tmp_path):
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model = make_tiny_model(tmp_path, "Llama", max_position_embeddings=96, rope_parameters=dynamic)
    want = hf_greedy_plain(model, LONG, NEW)
    loaded = load_model(str(tmp_path))
    check(generate(_engine(loaded), [LONG])[0], want, "dynamic within the context")
    with pytest.raises(ValueError, match="max_model_len 200 is more than the model's context"):
        LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_model_len=200)


def test_experts_other_than_swiglu_are_refused_at_load(tmp_path):
    make_tiny_model(tmp_path, "Mixtral", hidden_act="gelu_pytorch_tanh", num_local_experts=4)
    with pytest.raises(ValueError, match="'gelu_pytorch_tanh' in a mixture of experts"):
        read_model_config(str(tmp_path))


def test_olmoe_clip_qkv_is_refused_at_load(tmp_path):
    make_tiny_model(tmp_path, "Olmoe", num_experts=4, intermediate_size=32, clip_qkv=8.0)
    with pytest.raises(ValueError, match=r"clip_qkv 8.0 .* is not supported"):
        read_model_config(str(tmp_path))


def test_bidirectional_gemma3_is_refused_at_load(tmp_path):
    make_tiny_model(tmp_path, "Gemma3Text", head_dim=32, use_bidirectional_attention=True)
    with pytest.raises(ValueError, match=r"use_bidirectional_attention .* is not supported"):
        read_model_config(str(tmp_path))


def test_multimodal_gemma3_stops_at_the_top_level_eos_ids(tmp_path):
    """google/gemma-3-4b-it's config.json names EOS 1 and 106 (<end_of_turn>) at the top level,
    its text_config none: without generation_config.json, transformers generates until either
    (GenerationConfig.from_model_config), not until the text model's default 1 alone."""
    text = dict(SHAPE, head_dim=32, sliding_window=7)
    del text["num_attention_heads"], text["num_key_value_heads"]  # (the class defaults)
    cfg = transformers.Gemma3Config(text_config=text, eos_token_id=[1, 106])
    cfg.architectures = ["Gemma3ForConditionalGeneration"]
    cfg.save_pretrained(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    c["text_config"] = {k: v for k, v in c["text_config"].items() if k != "eos_token_id"}
    (tmp_path / "config.json").write_text(json.dumps(c))
    want = transformers.GenerationConfig.from_model_config(
        transformers.AutoConfig.from_pretrained(tmp_path)
    ).eos_token_id
    assert read_model_config(str(tmp_path)).eos_token_ids == tuple(want) == (1, 106)


CONTEXTS = {  # rope_parameters -> the context vLLM derives from a 64-token max_position_embeddings
    "yarn": ({**YARN, "original_max_position_embeddings": 32}, 128),  # Qwen3's advice: x4
    "linear": ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, 128),
    "llama3": ({**LLAMA3, "rope_theta": 10000.0, "original_max_position_embeddings": 16}, 64),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, 64),  # ours
}


@pytest.mark.parametrize("name", list(CONTEXTS))
def test_a_rope_scaling_extends_the_context_as_vllm_derives_it(tmp_path, name):
    """Qwen3's YaRN advice (rope_scaling factor 4 over 32,768, max_position_embeddings left at
    40,960, `--max-model-len 131072`) was refused; a linear factor stretches the context too,
    llama3's is in max_position_embeddings already (dynamic's base would move: refused)."""
    rope, context = CONTEXTS[name]
    make_tiny_model(tmp_path, "Llama", max_position_embeddings=64, rope_parameters=rope)
    assert read_model_config(str(tmp_path)).context_length == context


def test_yarn_serves_its_stretched_context_as_transformers(tmp_path):
    rope = {**YARN, "original_max_position_embeddings": 32}
    model = make_tiny_model(tmp_path, "Qwen3", head_dim=32, max_position_embeddings=64,
                            rope_parameters=rope)  # fmt: skip
    want = hf_greedy_plain(model, LONG, NEW)  # 76 positions: past max_position_embeddings
    loaded = load_model(str(tmp_path))
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_model_len=128)
    check(generate(llm, [LONG])[0], want, "yarn past max_position_embeddings")
    with pytest.raises(ValueError, match="max_model_len 129 is more than the model's context"):
        LLM(loaded=loaded, dtype="float32", kv_cache_memory=8 << 20, max_model_len=129)


def test_gemma3s_linear_factor_does_not_extend_its_context(tmp_path):
    """Its global layers' factor 8 is the model's own rotary (vLLM leaves Gemma 3 out too)."""
    make_tiny_model(tmp_path, "Gemma3Text", head_dim=16, max_position_embeddings=64,
                    rope_parameters={FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     SLIDING: {"rope_type": "default", "rope_theta": 1e4}})  # fmt: skip
    assert read_model_config(str(tmp_path)).context_length == 64
