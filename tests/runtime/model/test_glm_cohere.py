"""SmolLM3, OLMo 3, GLM-4 (and GLM) and Cohere / Cohere 2 against transformers, token for token,
on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py): float32,
prompts chunked into 16-token steps, three prompts sharing steps, a warm prefix cache on the
second pass, and a KV pool so small that requests are preempted; logits within 1e-3 of
transformers' plain greedy loop at every step.

- SmolLM3: NoPE layers (every `no_rope_layer_interval`-th by default) that also slide;
- OLMo 3: OLMo 2's layer with three window layers to a global one, the global layers' rotary
  scaled and the window layers' not;
- GLM-4 (and GLM): gate and up fused, a partial rotary (half of each head) in the interleaved
  layout, q/k/v biases; GLM-4's norms on attention's and the MLP's outputs;
- Cohere (per-head q/k LayerNorms) and Cohere 2 (window layers rotated, global ones NoPE):
  LayerNorm, attention and the MLP in parallel off one norm, the interleaved rotary, the
  logits scaled, a tied head;
- Cohere Compass (`CohereCompassForCausalLM`): Cohere 2's layer with the rotary in halves, a
  base per layer kind or none (NoPE) from `rope_parameters`.

Also: Cohere over two tensor-parallel ranks (gloo), the interleaved rotary bit for bit
against transformers' own functions (float32, bf16), the weights estimate against what the built
model holds, the hub's older config formats, and the config values and tensors the engine
refuses in one line at config time.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    FULL,
    SLIDING,
    built_fixture,
    case_fixture,
    check_two_ranks,
    gpu_test,
    greedy_test,
)
from hf_oracle import check_config_refused, make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
# name: (transformers config class prefix, config overrides)
CASES = {
    # NoPE on layers 1 and 3 (interval 2), which slide (transformers' default layer_types)
    "smollm3-nope-window": (
        "SmolLM3",
        dict(num_hidden_layers=4, no_rope_layer_interval=2, use_sliding_window=True,
             sliding_window=10, attention_bias=True),
    ),
    # three window layers to a global one (transformers' default layer_types); the global
    # layer's rotary scaled (linear), the window layers' not
    "olmo3-window-linear": (
        "Olmo3",
        dict(num_hidden_layers=4, sliding_window=10, rope_parameters={
            FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0}}),
    ),
    # fused gate_up_proj, half of each head rotating in pairs, q/k/v biases, four norms a layer
    "glm4-partial-interleaved": ("Glm4", dict(head_dim=32)),
    "glm-partial-interleaved": ("Glm", dict(head_dim=32, num_key_value_heads=1)),  # GLM-4-chat
    # LayerNorm, attention and MLP in parallel, interleaved rotary, scaled logits, tied head,
    # per-head q/k LayerNorms, biases
    "cohere-qknorm": ("Cohere", dict(use_qk_norm=True, attention_bias=True, logit_scale=0.5)),
    # window layers with rotary, global ones without (NoPE), every other layer
    "cohere2-window-nope": (
        "Cohere2", dict(num_hidden_layers=4, sliding_window=10, sliding_window_pattern=2,
                        logit_scale=0.25),
    ),
    # Cohere 2's layer, the rotary in halves (not pairs) with a base per layer kind: window
    # layers 10,000, global ones 500; logits scaled
    "cohere-compass-window-bases": (
        "CohereCompassText", dict(num_hidden_layers=3, sliding_window=10, logit_scale=0.5,
                                  layer_types=[SLIDING, FULL, SLIDING], rope_parameters={
                                      SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                                      FULL: {"rope_type": "default", "rope_theta": 500.0}}),
    ),
    # every layer global and NoPE but the first kind's (null: no rotary), no logit scale,
    # an untied head
    "cohere-compass-nope-untied": (
        "CohereCompassText", dict(num_hidden_layers=3, tie_word_embeddings=False,
                                  layer_types=[FULL, SLIDING, FULL], sliding_window=10,
                                  rope_parameters={
                                      SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                                      FULL: None}),
    ),
}  # fmt: skip


def _make(name: str, path):
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_per_layer_rotary_and_windows_read_as_transformers(case):
    name, path, model, _, _ = case
    f = read_model_config(str(path)).family
    types = getattr(model.config, "layer_types", None)
    assert list(f.window_layers) == ([t == SLIDING for t in types] if f.window_layers else [])
    if name.startswith("smollm3"):
        assert list(f.rope_layers) == [bool(x) for x in model.config.no_rope_layers]
        assert f.rope_layers == (True, False, True, False) and f.sliding_window == 10
    if name.startswith("cohere2"):
        assert f.window_layers == f.rope_layers == (True, False, True, False)
        assert f.logit_scale == 0.25
    if name == "cohere-compass-window-bases":
        assert f.rope_layers == () or all(f.rope_layers)
        assert (f.local_rope_theta, f.logit_scale, f.rope_interleaved) == (10000.0, 0.5, False)
        assert read_model_config(str(path)).rope_theta == 500.0
    if name == "cohere-compass-nope-untied":
        assert f.rope_layers == (False, True, False) and f.logit_scale == 1.0
    if name.startswith("olmo3"):
        assert f.window_layers == (True, True, True, False) and f.local_rope_theta == 10000.0


@pytest.mark.parametrize(("arch", "overrides", "tp"), [
    ("Glm4", dict(head_dim=32), 1),
    ("Cohere", dict(use_qk_norm=True, attention_bias=True), 1),
    ("Cohere", dict(use_qk_norm=True, num_key_value_heads=1, vocab_size=301), 2),
    ("CohereCompassText", dict(rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1e4}}), 1),
])  # fmt: skip
def test_the_weights_estimate_is_what_the_model_holds(tmp_path, arch, overrides, tp):
    """`server/weights.py` against the built model, bf16 from float32 files: GLM-4's fused
    gate_up and extra norms, Cohere's float32 LayerNorm weights and per-head q/k norms (with
    two ranks: rank 0's heads' rows; its one KV head replicated)."""
    from model_bytes import check_estimate

    make_tiny_model(tmp_path, arch, **overrides)
    check_estimate(tmp_path, tp)


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Tensor parallelism over gloo, two ranks, the small pool (chunked, preempted) then a warm
    cache: Cohere's per-head q/k norms, each rank its heads' rows (`cohere.py`), its parallel
    layer. Tokens and logits as transformers'. GLM-4's fused gate_up is listed as gate and up
    rows by Phi-3's `split_fused`, cut by width as Phi-3's on two ranks
    (test_tensor_parallel.py); its rotary and extra norms act per head and on the whole rows."""
    name = "cohere-qknorm"
    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name, kv_heads=1)


@pytest.mark.parametrize(("arch", "edit", "words"), [
    ("SmolLM3", {"use_sliding_window": False, "layer_types": [SLIDING]},
     "use_sliding_window is false"),
    ("Olmo3", {"rope_parameters": {FULL: {"rope_type": "default", "rope_theta": 1e4},
                                   SLIDING: {"rope_type": "linear", "factor": 2.0}}},
     "'linear' on OLMo 3's sliding-window layers"),
    ("Cohere2", {"sliding_window": None}, "Cohere 2 without a sliding_window"),
    ("Olmo3", {"layer_types": [SLIDING, FULL]}, "layer_types names 2 layers, the model has 1"),
])  # fmt: skip
def test_config_values_the_engine_does_not_run_are_refused_in_one_line(tmp_path, arch, edit, words):
    """Read with the config (before the server binds: exit 2), naming the value."""
    check_config_refused(tmp_path, arch, edit, words)


@pytest.mark.parametrize("family", ["glm", "cohere"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_rotary_is_transformers_bit_for_bit(family, dtype):
    """`ops.rotary_interleaved` on q [T, H, D] and k [T, Hkv, D] against transformers' own
    apply_rotary_pos_emb (GLM's partial one rounding per product, Cohere's in float32), from the
    cache by positions (the CUDA ops' path) and from pregathered rows (the CPU's)."""
    import importlib

    from pagoda.runtime.model.ops import build_cos_sin_cache, gather_cos_sin, rotary_interleaved

    hf = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    d, r = 32, 16 if family == "glm" else 32  # GLM: half of each head rotates
    g = torch.Generator().manual_seed(0)
    q = torch.randn(7, 4, d, generator=g).to(dtype)
    k = torch.randn(7, 2, d, generator=g).to(dtype)
    positions = torch.tensor([0, 1, 2, 40, 41, 300, 5])
    cache = build_cos_sin_cache(d, 10000.0, {"partial_rotary_factor": r / d} if r < d else None,
                                512)  # fmt: skip
    freqs = cache[positions, : r // 2]  # cos; HF's tables from the same frequencies
    emb = torch.cat([freqs, freqs], -1) if family == "glm" else freqs.repeat_interleave(2, -1)
    sin = cache[positions, r // 2 :]
    sin = torch.cat([sin, sin], -1) if family == "glm" else sin.repeat_interleave(2, -1)
    want_q, want_k = hf.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                             emb.to(dtype)[None], sin.to(dtype)[None])  # fmt: skip
    widen = family == "cohere"
    for rows in (positions, None):
        gq, gk = q.clone(), k.clone()
        table = cache if rows is not None else gather_cos_sin(positions, cache, dtype)
        rotary_interleaved(positions=rows, q=gq[..., :r], k=gk[..., :r], cos_sin_cache=table,
                           widen=widen)  # fmt: skip
        assert torch.equal(gq, want_q[0].transpose(0, 1)), rows
        assert torch.equal(gk, want_k[0].transpose(0, 1)), rows


# On CUDA in float32 with the defaults (the Triton ops and attention, whose rotary reads the
# cache by positions, CUDA graphs)
test_gpu_matches_transformers_with_graphs = gpu_test()


def test_olmo3s_hub_config_format_reads_as_transformers_reads_it(tmp_path):
    """Olmo-3's config.json on the hub: a top-level `rope_theta` and a yarn `rope_scaling` with
    its attention factor, which transformers puts on the global layers only; the window layers
    rotate with the plain base."""
    make_tiny_model(tmp_path, "Olmo3", num_hidden_layers=4, sliding_window=10)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters")
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
            "attention_factor": 1.2, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    cfg.update(rope_theta=500000.0, rope_scaling=yarn)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    assert theirs[SLIDING]["rope_type"] == "default" and theirs[FULL]["rope_type"] == "yarn"
    ours = read_model_config(str(tmp_path))
    assert ours.rope_theta == theirs[FULL]["rope_theta"] == 500000.0
    assert ours.rope_scaling["factor"] == 8.0 and ours.rope_scaling["attention_factor"] == 1.2
    assert ours.family.local_rope_theta == theirs[SLIDING]["rope_theta"] == 500000.0
    assert ours.family.window_layers == (True, True, True, False)


@pytest.mark.parametrize(("arch", "overrides", "tensor", "words"), [
    ("Glm4", dict(head_dim=32), "model.layers.0.post_mlp_layernorm.weight",
     "missing tensor 'model.layers.0.post_mlp_layernorm.weight'"),
    ("Cohere", dict(use_qk_norm=True), "model.layers.0.self_attn.q_norm.weight",
     r"q_norm.weight is \[16\], .* needs \[4, 16\]"),
])  # fmt: skip
def test_a_checkpoint_without_a_familys_tensor_is_refused_at_config_time(
    tmp_path, arch, overrides, tensor, words
):
    """GLM-4's extra norms and Cohere's per-head q/k norms are checked from the headers with
    config.json (one line, before the server binds): a missing one, or one per head_dim only."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(tmp_path, arch, num_hidden_layers=1, **overrides)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    if arch == "Glm4":
        del tensors[tensor]
    else:
        tensors[tensor] = tensors[tensor][0].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=words):
        read_model_config(str(tmp_path))


def test_cohere2s_older_config_format_reads_as_transformers_reads_it(tmp_path):
    """Command R7B's config.json on the hub: `sliding_window_pattern` (every fourth layer
    global) and no `layer_types`; the global layers are the NoPE ones."""
    make_tiny_model(tmp_path, "Cohere2", num_hidden_layers=5)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("layer_types")
    cfg.update(sliding_window_pattern=4)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = read_model_config(str(tmp_path))
    want = tuple(t == SLIDING for t in theirs.layer_types)
    assert ours.family.window_layers == ours.family.rope_layers == want
    assert want == (True, True, True, False, True)


# a Cohere Compass text config.json with what CohereCompassTextConfig leaves to defaults left
# out; its rope_parameters with the dangling top-level entries the hub's North config has
# (transformers drops them when the layer kinds are named)
COMPASS = {"architectures": ["CohereCompassForCausalLM"], "model_type": "cohere_compass_text",
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 300,
           "rope_parameters": {"rope_theta": 1.0, "rope_type": "default",
                               FULL: {"rope_type": "default", "rope_theta": 50000.0,
                                      "mrope_section": [4, 2, 2]}}}  # fmt: skip


def test_a_sparse_cohere_compass_config_reads_as_transformers_reads_it(tmp_path):
    """Every layer global and rotated (transformers' default layer_types) by the full-attention
    kind's base, the window unused, no logit scale, Cohere 2's ids, eps and tied head."""
    (tmp_path / "config.json").write_text(json.dumps(COMPASS))
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.architecture == "cohere_compass" and t.layer_types == [FULL, FULL]
    assert o.rope_theta == t.rope_parameters[FULL]["rope_theta"] == 50000.0
    assert o.family.rope_layers in ((), (True, True)) and o.family.window_layers == ()
    assert o.family.logit_scale == 1.0 and t.logit_scale is None
    assert (o.bos_token_id, list(o.eos_token_ids), o.tie_word_embeddings) == (
        t.bos_token_id, [t.eos_token_id], t.tie_word_embeddings)  # fmt: skip
    assert o.rms_norm_eps == t.layer_norm_eps and not o.family.rope_interleaved


@pytest.mark.parametrize(("edit", "words"), [
    ({"layer_types": [SLIDING, FULL]}, "rope_parameters names no 'sliding_attention' entry"),
    ({"rope_parameters": {FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "full_attention rotary .* is not supported"),
])  # fmt: skip
def test_what_cohere_compass_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    (tmp_path / "config.json").write_text(json.dumps({**COMPASS, **edit}))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
