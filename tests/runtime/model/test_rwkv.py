"""RWKV-4 (`RwkvForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the "rwkv"
entry of tests/runtime/hybrid_cases.py: time-mix and channel-mix in every layer, chunked,
batched, on a warm prefix cache, preempted, against transformers): the state slots and weights
estimates, the checkpoint check naming a missing decay, 16/32 bits only and a tensor-parallel
size that does not divide its widths (refused in one line), two tensor-parallel ranks against
transformers, and rwkv-4-169m-pile's config.json read without weights, its parameters as
transformers counts them."""

from __future__ import annotations

import json

import pytest
import torch
from hybrid_cases import check_missing_refused, check_refused

transformers = pytest.importorskip("transformers")

# RWKV/rwkv-4-169m-pile's config.json (transcribed, not fetched in this session; transformers'
# RwkvConfig docstring names it): 12 layers of 768, the channel-mix 3072 wide, untied
RWKV_169M = {"architectures": ["RwkvForCausalLM"], "model_type": "rwkv",
             "attention_hidden_size": 768, "bos_token_id": 0, "context_length": 1024,
             "eos_token_id": 0, "hidden_size": 768, "intermediate_size": 3072,
             "layer_norm_epsilon": 1e-05, "num_hidden_layers": 12, "rescale_every": 6,
             "tie_word_embeddings": False, "vocab_size": 50277}  # fmt: skip


def test_rwkv_estimates_and_refusals(built):
    """No KV cache; per layer and sequence the two token shifts (bf16) and num, den, max
    (float32); the weights estimate within 2%; a missing decay named; a tensor-parallel size
    that does not divide the channel-mix and FP8 refused in one line."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory

    path, _, loaded, _ = built("rwkv", reference=False)
    mc = loaded.config
    assert mc.num_kv_layers == 0 and mc.family.mamba.num_layers == 2
    check_estimate(path, rel=0.02)
    cfg = EngineConfig.create(str(path), device="cpu", dtype="bfloat16", max_num_seqs=8)
    per_layer = 2 * 64 * 2 + 64 * 3 * 4  # shifts [2 hidden, 1] in bf16, wkv [A, 3] in float32
    assert memory.check(mc, cfg, path, 256).parts()["Mamba state"] == 8 * 2 * per_layer
    check_missing_refused(
        loaded, ["model.layers.1.attention.time_decay", "model.layers.0.pre_ln.bias"]
    )
    check_refused("rwkv", mc)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool (preempted) then a warm cache: each rank its channels of
    the time-mix (k, v, r, the decay, the bonus, its wkv state slots), both token shifts whole,
    the channel-mix's key rows; transformers' tokens and logits; rank 0's weights estimate."""
    from arch_cases import check_two_ranks
    from model_bytes import check_estimate

    path, _, loaded, reference = built("rwkv")
    m = loaded.config.family.mamba
    local = m.on_ranks(2)
    assert local.d_inner == m.d_inner // 2 and local.conv_state_rows == m.conv_state_rows
    check_two_ranks(path, loaded, reference, "rwkv")
    check_estimate(path, 2, rel=0)


def test_rwkv_169m_config(tmp_path):
    """rwkv-4-169m-pile: 12 layers, no attention; its parameters as transformers counts them on
    the meta device."""
    from pagoda.runtime.model.loader import read_model_config

    (tmp_path / "config.json").write_text(json.dumps(RWKV_169M))
    mc = read_model_config(str(tmp_path))
    m = mc.family.mamba
    assert m.num_layers == 12 and mc.num_kv_layers == 0 and m.d_inner == 768
    assert mc.intermediate_size == 3072 and not mc.tie_word_embeddings
    with torch.device("meta"):
        model = transformers.RwkvForCausalLM(transformers.RwkvConfig(**RWKV_169M))
    assert mc.num_params == sum(p.numel() for p in model.parameters())
