"""Tensor parallelism for the hybrids' Mamba2 mixers (`model/mamba_shard.py`) over gloo: two
ranks give transformers' tokens and logits (1e-3) for Granite 4.0 (two B/C groups, one per
rank; experts and the shared MLP split by width under one all-reduce), Bamba (one group
replicated, its gated norm over a group both ranks hold half of), Nemotron-H (the MoE block's
experts and shared expert split by width, with latent projections and without; one group or
two) and Falcon-H1 (µP multipliers on in_proj's five parts, the norm before the gate over a
group split across the ranks). Each on the small pool: 16-token chunks, three prompts sharing
steps, preempted and recomputed, then again from the prefix cache (each rank restoring its
heads' Mamba state from its snapshots, the copies sent with the step's slots)."""

from __future__ import annotations

import pytest
from arch_cases import NEW, SMALL_POOL, built_fixture, check, generate, prompts
from hf_oracle import make_tiny_model
from pagoda.runtime import LLM

transformers = pytest.importorskip("transformers")
MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8)
CASES = {
    "granite4-moe": (
        "GraniteMoeHybrid",
        dict(num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], **MAMBA,
             mamba_n_groups=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
             shared_intermediate_size=48, position_embedding_type="rope",
             embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.1,
             logits_scaling=1.5),
    ),
    "bamba": (
        "Bamba",
        dict(num_hidden_layers=3, attn_layer_indices=[1], **MAMBA, mamba_d_head=32,
             mlp_bias=True, max_position_embeddings=512),
    ),
    "nemotron-h-moe": (
        "NemotronH",
        dict(layers_block_type=["mamba", "moe", "attention", "mlp"], num_hidden_layers=4,
             mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=1, chunk_size=8,
             head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48, use_bias=True),
    ),
    "nemotron-h-moe-latent": (  # the experts' sum projected back before the shared expert's
        "NemotronH",
        dict(layers_block_type=["mamba", "moe", "attention"], num_hidden_layers=3,
             mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=8,
             head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48, moe_latent_size=32),
    ),
    "falcon-h1": (
        "FalconH1",
        dict(num_hidden_layers=2, mamba_d_ssm=128, mamba_n_heads=4, mamba_d_state=16,
             mamba_chunk_size=8, mamba_rms_norm=True, head_dim=16, ssm_in_multiplier=1.2,
             ssm_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
             mamba_proj_bias=True),
    ),
}  # fmt: skip

built = built_fixture(lambda name, path: make_tiny_model(path, *CASES[name][:1], **CASES[name][1]))


@pytest.mark.slow  # a second process (gloo) per case: ~5 s each on 2 busy cores
@pytest.mark.parametrize("name", CASES)
def test_two_ranks_match_transformers(built, name):
    path, _, loaded, reference = built(name)
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        core = two.engine
        assert core.scheduler.num_preemptions > 0
        assert core.kv.prefix_hits > 0  # KV blocks and each rank's Mamba state snapshots
        m = loaded.config.family.mamba
        layer = next(i for i, x in enumerate(m.layers) if x)
        conv, ssm = core.runner.mamba.states[layer]  # this rank's heads (and its groups)
        groups = max(1, m.n_groups // 2)
        assert ssm.shape[1] == m.n_heads // 2
        assert conv.shape[1] == m.d_inner // 2 + 2 * groups * m.d_state
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"{name}: prompt {i}, two ranks")
    assert NEW > 0
