"""Hybrid state-space models (Mamba2 layers among attention layers) against transformers, token
for token, on tiny random checkpoints transformers writes itself (tests/runtime/hf_oracle.py):
float32, logits within 1e-3 of transformers' plain greedy loop (its `torch_forward` scan over
the whole sequence) at every step.

- Granite 4.0 (`GraniteMoeHybridForCausalLM`): experts beside the shared MLP, rotary, Granite's
  multipliers, two groups of B/C; and a dense NoPE one, attention first;
- Bamba (`BambaForCausalLM`): half-rotary attention, a dense MLP with biases.

Each case runs prompts in 16-token steps (chunked prefill carries the state across chunks; the
SSD scan's chunk of 8 splits them further), three prompts sharing steps with two state slots
(slots reused, zeroed for the new sequence), then again in reverse order on the same engine;
then a KV pool so small that requests are preempted (their state rebuilt by recompute); a
one-token prompt (its first step a decode row from a zeroed slot).
"""

from __future__ import annotations

import re

import pytest
import torch
from arch_cases import NEW, SMALL_POOL, built_fixture, case_fixture, check, generate, prompts
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")
MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8)
CASES = {
    "granite4-moe-rope": (
        "GraniteMoeHybrid",
        dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], **MAMBA,
             mamba_n_groups=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
             shared_intermediate_size=48, position_embedding_type="rope",
             embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.1,
             logits_scaling=1.5),
    ),
    "granite4-dense-nope": (
        "GraniteMoeHybrid",
        dict(num_hidden_layers=3, layer_types=["attention", "mamba", "mamba"], **MAMBA,
             num_local_experts=0, shared_intermediate_size=64, residual_multiplier=0.5),
    ),
    "bamba": (
        "Bamba",
        dict(num_hidden_layers=3, attn_layer_indices=[1], **MAMBA, mamba_d_head=32,
             mlp_bias=True, max_position_embeddings=512),
    ),
}  # fmt: skip


def _make(name: str, path):
    arch, overrides = CASES[name]
    return make_tiny_model(path, arch, **overrides)


built = built_fixture(_make)
case = case_fixture(CASES)


def test_greedy_matches_transformers_chunked_batched_and_preempted(case):
    name, _, model, loaded, reference = case
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, block_size=16,
              max_num_batched_tokens=16, max_num_seqs=2)  # fmt: skip
    assert not llm.engine.config.cache.enable_prefix_caching  # off for recurrent layers
    cold = generate(llm, prompts())
    warm = generate(llm, prompts()[::-1])[::-1]
    for i, want in enumerate(reference):
        check(cold[i], want, f"{name}: prompt {i}, cold")
        check(warm[i], want, f"{name}: prompt {i}, again")
    assert llm.engine.runner.mamba.num_held == 0
    one = [7]  # a one-token prompt: its first step is a decode row
    check(generate(llm, [one])[0], hf_greedy_plain(model, one, NEW), f"{name}: one token")
    small = LLM(loaded=loaded, **SMALL_POOL)
    got = generate(small, prompts())
    assert small.engine.scheduler.num_preemptions > 0
    for i, want in enumerate(reference):
        check(got[i], want, f"{name}: prompt {i}, preempted")
    small.engine.check_integrity()


def test_state_slots_and_kv_layers(built):
    """The KV cache holds the attention layers only; each Mamba layer one conv and one SSM
    state slot per sequence (max_num_seqs of them)."""
    _, _, loaded, _ = built("granite4-moe-rope")
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=3,
              block_size=16)  # fmt: skip
    runner = llm.engine.runner
    assert loaded.config.num_kv_layers == 1
    conv, ssm = runner.kv_caches[0]
    assert conv.shape == (3, 128 + 2 * 2 * 16, 3) and ssm.shape == (3, 4, 32, 16)
    assert len(runner.kv_caches) == 3 and runner.kv_caches[2][1].shape == ssm.shape
    assert runner.bytes_per_block == 16 * runner.backend.bytes_per_token(torch.float32)


def test_tensor_parallel_and_fp8_refused(built):
    _, _, loaded, _ = built("granite4-dense-nope")
    with pytest.raises(ValueError, match="runs on one rank only"):
        LLM(loaded=loaded, dtype="float32", tensor_parallel_size=2)
    from pagoda.runtime.engine.recurrent import check_engine

    with pytest.raises(ValueError, match="fp8 quantization is not supported"):
        check_engine(loaded.config, 1, "fp8")


def test_a_missing_mamba_tensor_is_refused_in_one_line(built):
    from pagoda.runtime.model.checkpoint_check import check_checkpoint
    from safetensors import safe_open

    path, _, loaded, _ = built("bamba")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        headers = {k: ("F32", list(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    check_checkpoint(loaded.config, headers)
    del headers["model.layers.2.mamba.dt_bias"]
    with pytest.raises(
        ValueError, match=re.escape("missing tensor 'model.layers.2.mamba.dt_bias'")
    ):
        check_checkpoint(loaded.config, headers)
    headers["model.layers.2.mamba.dt_bias"] = ("F32", [5])
    with pytest.raises(ValueError, match=re.escape("mamba.dt_bias is [5]")):
        check_checkpoint(loaded.config, headers)


@pytest.mark.parametrize("name", ["granite4-moe-rope", "bamba"])
def test_the_weights_and_state_estimates(built, name):
    """`server/weights.py` against the built model (bf16), and the memory estimate's state
    slots: max_num_seqs x the Mamba layers' conv and SSM states."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory

    path, _, loaded, _ = built(name)
    check_estimate(path)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    fp = memory.estimate(loaded.config, cfg, path, torch.device("cpu"))
    m = loaded.config.family.mamba
    per_seq = 2 * (m.conv_dim * 3 + m.n_heads * m.head_dim * m.d_state) * 2  # 2 layers, bf16
    assert fp.parts()["Mamba state"] == 8 * per_seq
    assert memory.kv_bytes_per_token(loaded.config, torch.bfloat16, "auto") == 1 * 2 * 2 * 16 * 2
