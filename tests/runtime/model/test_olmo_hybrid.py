"""OLMo Hybrid (Gated DeltaNet layers among OLMo 3's attention layers, `model/olmo_hybrid.py`)
against transformers, token for token, on tiny random checkpoints transformers writes itself
(tests/runtime/hf_oracle.py): float32, logits within 1e-3 of transformers' plain greedy loop
(its torch chunked delta rule) at every step.

The cases are the "olmo-hybrid" rows of tests/runtime/hybrid_cases.py (a DeltaNet layer first,
beta doubled, rotary; attention first, beta in [0, 1], NoPE, a conv of 3), checkpoints written
once a session by its `built` fixture; each runs `hybrid_checks.check_chunked_batched_preempted`
(16-token steps carrying the conv and delta states, three prompts sharing steps with two
state slots, again in reverse order, a one-token prompt, preempted and recomputed).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import SMALL_POOL, case_fixture, check, generate, prompts
from hybrid_cases import check_missing_refused, check_refused
from hybrid_checks import check_chunked_batched_preempted, check_warm_prefix
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

case = case_fixture(["olmo-hybrid", "olmo-hybrid-nope"])


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    check_chunked_batched_preempted(case)


def test_beta_and_rotary_read_from_the_config(case):
    name, _, _, loaded, _ = case
    assert loaded.config.family.mamba.allow_neg_eigval == (name == "olmo-hybrid")
    rope = loaded.config.family.rope_layers  # (empty: every layer rotates)
    assert (not rope or any(rope)) == (name == "olmo-hybrid")


def test_a_warm_prefix_restores_the_delta_state(built, monkeypatch):
    _, model, loaded, _ = built("olmo-hybrid")
    check_warm_prefix("olmo-hybrid", model, loaded, monkeypatch, budgets=(256,))  # (16: qwen3.5's)


def test_estimates_checks_and_a_sparse_config(built, tmp_path):
    """The weights estimate against the built model (one rank, rank 0 of two); the checkpoint
    check naming a missing DeltaNet tensor and an attention layer's post-MLP norm; a tensor
    parallel size that does not divide the key heads, and FP8, refused in one line; a config.json with
    transformers' defaults only (OlmoHybridConfig's: Olmo-Hybrid-7B's shape) read without
    weights."""
    from model_bytes import check_estimate
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.model.loader import read_model_config

    path, _, loaded, _ = built("olmo-hybrid")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    check_refused("olmo-hybrid", mc)
    tp_check(mc, 2)
    check_estimate(path, tp=2, rel=0.02)
    check_missing_refused(loaded, ["model.layers.0.linear_attn.g_proj.weight",
                                   "model.layers.1.post_feedforward_layernorm.weight"])  # fmt: skip
    cfg = {"architectures": ["OlmoHybridForCausalLM"], "model_type": "olmo_hybrid"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    hub = read_model_config(str(tmp_path))
    m = hub.family.mamba
    assert m.layers == tuple(i % 4 != 3 for i in range(32)) and m.allow_neg_eigval
    assert (m.n_heads, m.n_groups, m.d_state, m.head_dim) == (30, 30, 96, 192)
    assert hub.num_kv_heads == 30 and hub.head_dim == 128 and not hub.family.rope_layers
    want = transformers.OlmoHybridConfig()
    assert want.linear_key_head_dim == 96 and want.linear_value_head_dim == 192
    assert 6e9 < hub.num_params < 9e9, hub.num_params


@pytest.mark.slow  # a second process (gloo): ~6 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Tensor parallelism over gloo, two ranks: each holds one of the two key heads and its
    value head (projection rows, conv channels, A, dt_bias, state slots; o_proj row-parallel),
    two of the four query heads and one KV head (q/k norms over the whole rows all-reduced),
    the MLP split by width; on the small pool (preempted and recomputed): transformers'
    tokens and logits."""
    path, _, loaded, reference = built("olmo-hybrid")
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts())
        assert two.engine.scheduler.num_preemptions > 0
        two.engine.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i], f"olmo-hybrid: prompt {i}, two ranks")


def test_the_checkpoint_under_transformers_module_names(built, tmp_path):
    """transformers saves OLMo Hybrid under OLMo-core's names (the conv in q/k/v parts, split
    evenly; `attention_layer_norm`, `feedforward_layer_norm`: what the main tests read); a
    checkpoint under the module names (one `conv1d.weight`, `input_layernorm`,
    `post_attention_layernorm`) reads alike: transformers' tokens."""
    import shutil

    from pagoda.runtime.model.loader import load_model
    from safetensors.torch import load_file, save_file

    path, _, _, reference = built("olmo-hybrid")
    out = tmp_path / "renamed"
    shutil.copytree(path, out)
    tensors = load_file(str(path / "model.safetensors"))
    assert "model.layers.0.linear_attn.q_conv1d.weight" in tensors
    renamed = {}
    for name, t in tensors.items():
        name = name.replace(".attention_layer_norm.", ".input_layernorm.")
        name = name.replace(".feedforward_layer_norm.", ".post_attention_layernorm.")
        renamed[name] = t
    for i in (0, 2):
        p = f"model.layers.{i}.linear_attn."
        parts = [renamed.pop(f"{p}{x}_conv1d.weight") for x in "qkv"]
        renamed[p + "conv1d.weight"] = torch.cat(parts).contiguous()
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    llm = LLM(loaded=load_model(str(out)), dtype="float32", kv_cache_memory=16 << 20,
              block_size=16, max_num_batched_tokens=16, max_num_seqs=3)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"module names: prompt {i}")
