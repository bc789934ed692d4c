"""Tiny hybrid checkpoints (Mamba2 layers, or LFM2's short convs, among attention layers) as transformers' configs:
shared by tests/runtime/model/test_hybrid_ssm.py (`CASES`, one rank) and
tests/runtime/distributed/test_tp_hybrid.py (`TP_CASES`, two ranks: every case's heads, groups
and widths split in two)."""

from __future__ import annotations

MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8)
# name: (transformers config class prefix, config overrides)
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
    "granite4-all-mamba": (  # transformers' default layer_types: no attention, no KV cache
        "GraniteMoeHybrid",
        dict(num_hidden_layers=2, **MAMBA, num_local_experts=0, shared_intermediate_size=64),
    ),
    "bamba": (
        "Bamba",
        dict(num_hidden_layers=3, attn_layer_indices=[1], **MAMBA, mamba_d_head=32,
             mlp_bias=True, max_position_embeddings=512),
    ),
    # one block a layer: Mamba2 (biased projections), ReLU² MLP, attention without rotary
    "nemotron-h": (
        "NemotronH",
        dict(layers_block_type=["mamba", "mlp", "attention", "mlp", "mamba"],
             num_hidden_layers=5, mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16,
             n_groups=2, chunk_size=8, head_dim=16, use_bias=True, mlp_bias=True),
    ),
    # Nemotron 3's MoE blocks: sigmoid router over 2 groups with correction biases (scrambled
    # by test_hybrid_ssm.py), routed scale, latent projections, a shared expert
    "nemotron-h-moe": (
        "NemotronH",
        dict(layers_block_type=["mamba", "moe", "attention", "moe"], num_hidden_layers=4,
             mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2, chunk_size=8,
             head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             moe_shared_expert_intermediate_size=48, moe_latent_size=32, n_group=2,
             topk_group=1, routed_scaling_factor=2.5),
    ),
    # attention and Mamba2 side by side, every µP multiplier, the norm before the gate
    "falcon-h1-mup": (
        "FalconH1",
        dict(num_hidden_layers=2, mamba_d_ssm=96, mamba_n_heads=3, mamba_d_state=16,
             mamba_chunk_size=8, mamba_rms_norm=True, head_dim=16, key_multiplier=0.5,
             attention_in_multiplier=1.5, attention_out_multiplier=0.8, ssm_in_multiplier=1.2,
             ssm_out_multiplier=0.9, ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
             mlp_multipliers=[0.7, 1.4], embedding_multiplier=2.0, lm_head_multiplier=0.6,
             projectors_bias=True),
    ),
    "falcon-h1-gate-only": (  # no output norm: y * silu(z); two groups of B/C
        "FalconH1",
        dict(num_hidden_layers=2, mamba_n_heads=4, mamba_d_ssm=128, mamba_d_state=16,
             mamba_n_groups=2, mamba_chunk_size=8, mamba_rms_norm=False, mamba_proj_bias=True),
    ),
    # LFM2: gated short convs among Qwen3-style attention layers (q/k norms), tied, the MLP's
    # width adjusted (2/3, x 1.5, rounded up to 16); then biases on the convs and their
    # projections, a wider conv, the older config keys (full_attn_idxs, block_ff_dim as is)
    "lfm2": (
        "Lfm2",
        dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
             block_multiple_of=16, block_ffn_dim_multiplier=1.5),
    ),
    "lfm2-bias": (
        "Lfm2",
        dict(num_hidden_layers=3, full_attn_idxs=[2], conv_bias=True, conv_L_cache=4,
             block_auto_adjust_ff_dim=False, tie_word_embeddings=False),
    ),
    # LFM2-MoE: a dense layer, then 8 sigmoid-routed experts (top 3) with the choice-only bias
    # (scrambled by test_hybrid_ssm.py), routed scale, renormalised
    "lfm2-moe": (
        "Lfm2Moe",
        dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
             num_dense_layers=1, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
             routed_scaling_factor=1.5),
    ),
    # Mamba2 alone (Mamba2ForCausalLM): no attention, no MLP, its `backbone.` names; two
    # groups of B/C, biased projections, a time-step limit
    "mamba2": (
        "Mamba2",
        dict(num_hidden_layers=2, num_heads=4, head_dim=32, state_size=16, n_groups=2,
             chunk_size=8, use_bias=True, time_step_limit=(0.0, 5.0)),
    ),
    # Mamba-1 (MambaForCausalLM): A [d_inner, d_state], dt from a rank-4 projection, biased
    # projections, d_inner config.json's intermediate_size (128), not expand x hidden (192);
    # Falcon-Mamba's weightless norms on B, C and dt, no conv bias
    "mamba1": (
        "Mamba",
        dict(num_hidden_layers=2, state_size=8, time_step_rank=4, use_bias=True, expand=3),
    ),
    "falcon-mamba": (
        "FalconMamba",
        dict(num_hidden_layers=2, state_size=8, use_conv_bias=False, mixer_rms_eps=1e-5),
    ),
    # Jamba: attention (no rotary) on layers 1 and 3, Mamba-1 mixers with weighted dt/B/C norms
    # and biased projections on 0 and 2; experts (top 2 of 4, not renormalised) on layers 0
    # (Mamba) and 3 (attention), dense MLPs on 1 and 2
    "jamba": (
        "Jamba",
        dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
             expert_layer_period=3, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
             intermediate_size=48, mamba_d_state=8, mamba_proj_bias=True),
    ),
    # Zamba2: a Mamba2 mixer in every layer (two groups of B/C, biased projections), two shared
    # blocks used in turn by three hybrid layers (block 0 twice), LoRA adapters on the MLP and
    # on q/k/v, rotary, exact GELU
    "zamba2": (
        "Zamba2",
        dict(num_hidden_layers=5, layers_block_type=["mamba", "hybrid", "mamba", "hybrid",
             "hybrid"], num_attention_heads=4, num_key_value_heads=4, num_mem_blocks=2,
             use_shared_attention_adapter=True, adapter_rank=8, use_mem_rope=True,
             n_mamba_heads=4, mamba_d_state=16, mamba_ngroups=2, chunk_size=8,
             intermediate_size=96, add_bias_linear=True),
    ),
    # Zamba2 as Zamba2-1.2B: one block used by two hybrid layers (the first layer one), adapters
    # on the MLP only, grouped-query attention without rotary
    "zamba2-one-block": (
        "Zamba2",
        dict(num_hidden_layers=3, layers_block_type=["hybrid", "mamba", "hybrid"],
             num_attention_heads=4, num_key_value_heads=2, adapter_rank=8, n_mamba_heads=4,
             mamba_d_state=16, chunk_size=8, intermediate_size=96),
    ),
}  # fmt: skip
# two ranks: Granite 4.0's two B/C groups (one a rank) and Bamba's one (replicated) as above;
# Nemotron-H's MoE block with one group or two, with latent projections and without; Falcon-H1's
# norm before the gate over a group split across the ranks (four heads: Falcon's three above
# do not split in two)
TP_CASES = {
    "granite4-moe": CASES["granite4-moe-rope"],
    "bamba": CASES["bamba"],
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
    "mamba2": CASES["mamba2"],  # no attention: the mixers alone split (one group a rank)
}  # fmt: skip
