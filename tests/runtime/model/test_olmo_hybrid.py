"""OLMo Hybrid (Gated DeltaNet layers among OLMo 3's attention layers, `model/olmo_hybrid.py`)
against transformers, token for token, on tiny random checkpoints transformers writes itself
(tests/runtime/hf_oracle.py): float32, logits within 1e-3 of transformers' plain greedy loop
(its torch chunked delta rule) at every step.

- "olmo-hybrid": a DeltaNet layer first, beta doubled (`linear_allow_neg_eigval`, the default),
  rotary, grouped KV heads, value heads wider than key heads;
- "olmo-hybrid-nope": attention first, beta in [0, 1], no rotary (`rope_parameters` without a
  `rope_theta`, as transformers reads NoPE), a conv of 3.

Each runs its prompts in 16-token steps (chunked prefill carries the conv and delta states
across steps), three prompts sharing steps with two state slots, then a one-token prompt,
then a KV pool so small that requests are preempted (their states rebuilt by recompute).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import NEW, SMALL_POOL, built_fixture, case_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")

LIN, FULL = "linear_attention", "full_attention"
CASES = {
    "olmo-hybrid": dict(num_hidden_layers=3, layer_types=[LIN, FULL, LIN],
                        linear_num_key_heads=2, linear_num_value_heads=2,
                        linear_key_head_dim=16, linear_value_head_dim=24),
    "olmo-hybrid-nope": dict(num_hidden_layers=2, layer_types=[FULL, LIN], num_key_value_heads=4,
                             linear_allow_neg_eigval=False, linear_conv_kernel_dim=3,
                             rope_parameters={"rope_type": "default", "rope_theta": None}),
}  # fmt: skip


def _make(name: str, path):
    return make_tiny_model(path, "OlmoHybrid", **CASES[name])


built = built_fixture(_make)
case = case_fixture(CASES)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    name, _, model, loaded, reference = case
    m = loaded.config.family.mamba
    assert m.allow_neg_eigval == (name == "olmo-hybrid")
    rope = loaded.config.family.rope_layers  # (empty: every layer rotates)
    assert (not rope or any(rope)) == (name == "olmo-hybrid")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"{name}: prompt {i}")
    assert llm.engine.runner.mamba.num_held == 0
    one = [7]  # a one-token prompt: its first step is a decode row
    check(generate(llm, [one])[0], hf_greedy_plain(model, one, NEW), f"{name}: one token")
    small = LLM(loaded=loaded, **SMALL_POOL)
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    small.engine.check_integrity()


def test_a_warm_prefix_restores_the_delta_state(built):
    """Prefix caching: a 153-token prompt, then one sharing its first 140 tokens restores the
    states' snapshot at 128 and computes the rest: transformers' tokens and logits."""
    _, model, loaded, _ = built("olmo-hybrid")
    shared = [(11 * i + 3) % 290 + 5 for i in range(150)]
    second = [*shared[:140], 21, 22]
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=256, max_num_seqs=2, max_model_len=256)  # fmt: skip
    generate(llm, [[*shared, 7, 8, 9]])
    hits = llm.engine.kv.prefix_hits
    check(generate(llm, [second])[0], hf_greedy_plain(model, second, NEW), "warm")
    assert llm.engine.kv.prefix_hits - hits == 128


def test_estimates_checks_and_a_sparse_config(built, tmp_path):
    """The weights estimate against the built model (one rank, rank 0 of two); the checkpoint
    check naming a missing DeltaNet tensor and an attention layer's post-MLP norm; a tensor
    parallel size that does not divide the key heads, and FP8, refused in one line; a config.json with
    transformers' defaults only (OlmoHybridConfig's: Olmo-Hybrid-7B's shape) read without
    weights."""
    import re
    from types import SimpleNamespace

    from model_bytes import check_estimate
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.core import check_dtype
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from pagoda.runtime.model.loader import read_model_config

    path, _, loaded, _ = built("olmo-hybrid")
    mc = loaded.config
    check_estimate(path, rel=0.02)
    with pytest.raises(ValueError, match=re.escape("--tensor-parallel-size 4 does not divide "
                                                   "the Gated DeltaNet key heads "
                                                   "(linear_num_key_heads 2)")):  # fmt: skip
        tp_check(mc, 4)
    tp_check(mc, 2)
    check_estimate(path, tp=2, rel=0.02)
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)
    with pytest.raises(ValueError, match=r"fp8 is not supported .*\(gated_deltanet layers\)"):
        check_dtype(fp8, mc)
    headers = {n: loaded.weights.dtype_and_shape(n) for n in loaded.weights}
    check_checkpoint(mc, headers)
    for gone in ("model.layers.0.linear_attn.g_proj.weight",
                 "model.layers.1.post_feedforward_layernorm.weight"):  # fmt: skip
        short = {n: v for n, v in headers.items() if n != gone}
        with pytest.raises(ValueError, match=re.escape(f"missing tensor '{gone}'")):
            check_checkpoint(mc, short)
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
