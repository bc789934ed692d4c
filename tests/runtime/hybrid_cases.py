"""The recurrent families' tiny checkpoints (Mamba2 layers, LFM2's short convs, Mamba-1's,
Gated DeltaNet's and Kimi Delta Attention's layers, among attention layers or alone) as
transformers' configs, one row a case, each written once, and what `pagoda serve` refuses for
them:

- `CASES`: name -> (transformers config class prefix, config overrides); `write` makes a row's
  checkpoint (router biases scrambled where a row has them);
- the session fixture `built` (tests/runtime/model/conftest.py) writes each checkpoint, and
  transformers' greedy tokens and logits of `arch_cases.prompts()`, once per pytest process,
  whichever family's test file asks first;
- `REFUSED`, `check_refused`, `check_missing_refused`: the sizes, options and tensors refused in
  one line.

Also `TP_CASES` (two ranks: every case's heads, groups and widths split in two), for
tests/runtime/distributed/test_tp_hybrid.py. The checks the families' test files run on these
checkpoints against transformers: `hybrid_checks.py`."""

from __future__ import annotations

import torch
from arch_cases import NEW, prompts
from hf_oracle import (
    TINY,
    hf_greedy_plain_batch,
    make_tiny_model,
    make_tiny_wrapped,
)

MAMBA = dict(mamba_n_heads=4, mamba_d_state=16, mamba_chunk_size=8)
LIN, FULL, SLIDE = "linear_attention", "full_attention", "sliding_attention"
DELTA_HEADS = dict(head_dim=16, num_attention_heads=4, num_key_value_heads=2)
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
    # by `write`), routed scale, latent projections, a shared expert
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
    # (scrambled by `write`), routed scale, renormalised
    "lfm2-moe": (
        "Lfm2Moe",
        dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
             num_dense_layers=1, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
             routed_scaling_factor=1.5),
    ),
    # LFM3: LFM2's convs beside full-attention layers (proportional rotary: half the angles)
    # and sliding ones (an 8-key window, their own rotary base), each head's output gated by
    # sigmoid(g_proj(x)), the sandwich norms; untied
    "lfm3": (
        "Lfm3",
        dict(num_hidden_layers=4, layer_types=["conv", "sliding_attention", "full_attention",
                                               "conv"], sliding_window=8, head_dim=16,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
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
    # Zamba (model/zamba.py): Mamba-1 mixers in two heads (each its own x_proj, dt_proj, B, C;
    # in_proj's rows interleaved, biased projections) in every layer, one shared block (no
    # adapters, no rotary, grouped-query attention over [stream, embeddings]) used by two
    # hybrid layers
    "zamba": (
        "Zamba",
        dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
             n_mamba_heads=2, mamba_d_state=8, mamba_dt_rank=6, mamba_proj_bias=True,
             intermediate_size=96),
    ),
    # RecurrentGemma (model/recurrent_gemma.py): RG-LRU blocks (four gate blocks) beside local
    # attention (a window of 8 keys, one KV head, rotary on half of each head, o_proj biased),
    # GeGLU MLPs with biases, Gemma's norms, the logits soft-capped
    "recurrent-gemma": (
        "RecurrentGemma",
        dict(num_hidden_layers=3, block_types=["recurrent", "attention", "recurrent"],
             num_key_value_heads=1, attention_window_size=8, intermediate_size=192,
             logits_soft_cap=20.0),
    ),
    # RWKV-4 (model/rwkv.py): time-mix (the wkv recurrence) and channel-mix in every layer, the
    # token shift from the state slots, LayerNorms with biases, no attention; untied
    "rwkv": ("Rwkv", dict(num_hidden_layers=2, intermediate_size=128)),
    # xLSTM (model/xlstm.py): mLSTM layers (two heads, q/k half as wide as v, soft-capped
    # gates, a LayerNorm per head) and SwiGLU FFNs, no attention; the logits soft-capped
    "xlstm": ("xLSTM", dict(num_hidden_layers=2, num_heads=2, output_logit_soft_cap=20.0)),
    # Gated DeltaNet among gated attention (model/qwen3_next.py). Qwen3-Next: experts with the
    # shared expert and its gate, a dense layer (`mlp_only_layers`), two value heads per key
    # head, top-k not renormalised; Qwen3.5: a dense MLP, as many key heads as value heads, key
    # heads wider than value heads, a conv of 3, tied; Qwen3.5-MoE: attention first, experts in
    # every layer
    "qwen3-next": ("Qwen3Next", dict(
        **DELTA_HEADS, num_hidden_layers=3, layer_types=[LIN, FULL, LIN], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, mlp_only_layers=[2], norm_topk_prob=False)),
    "qwen3.5": ("Qwen3_5Text", dict(
        **DELTA_HEADS, num_hidden_layers=3, layer_types=[LIN, LIN, FULL], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16,
        linear_conv_kernel_dim=3, tie_word_embeddings=True)),
    "qwen3.5-moe": ("Qwen3_5MoeText", dict(
        **DELTA_HEADS, num_hidden_layers=2, layer_types=[FULL, LIN], linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32)),
    # LaraMini (model/lara_mini.py): Qwen3.5's DeltaNet (one fused in_proj, out_norm), Qwen3
    # attention rotating in a window of 8 on the sliding layers, NoPE on the full one, Flint's
    # experts (float32 router, stacked experts, an ungated shared expert) in every layer
    "lara-mini": ("LaraMini", dict(
        **DELTA_HEADS, num_hidden_layers=4, layer_types=[LIN, SLIDE, FULL, SLIDE],
        sliding_window=8, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48)),
    # Qwen4-Exp (model/qwen4_exp.py): Qwen3.5-MoE's layers between two hyper-connection
    # streams, Per-Layer Embeddings of hashed 2- and 3-grams on the DeltaNet layer (their table
    # saved in two shards), its output gate a sigmoid; an end-of-sequence id (12) inside the
    # prompts cuts their n-grams; the QSA indexer keeps 2 blocks of 4 and the tail: sparse past 11
    "qwen4-exp": ("Qwen4ExpText", dict(
        **DELTA_HEADS, num_hidden_layers=2, layer_types=[LIN, FULL], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, hc_count=2, hc_lowrank=16, ple_layer_ids=[1],
        ple_embed_dim=32, heads_per_ngram=2, ngram_vocab_size_base=61,
        make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2, output_gate_type="sigmoid",
        eos_token_id=12, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
        indexer_budget=8, indexer_compress_ratio=4)),
    # OLMo Hybrid (model/olmo_hybrid.py): a DeltaNet layer first, beta doubled
    # (`linear_allow_neg_eigval`, the default), rotary, grouped KV heads, value heads wider than
    # key heads; then attention first, beta in [0, 1], no rotary (`rope_parameters` without a
    # `rope_theta`, as transformers reads NoPE), a conv of 3
    "olmo-hybrid": ("OlmoHybrid", dict(
        num_hidden_layers=3, layer_types=[LIN, FULL, LIN], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=24)),
    "olmo-hybrid-nope": ("OlmoHybrid", dict(
        num_hidden_layers=2, layer_types=[FULL, LIN], num_key_value_heads=4,
        linear_allow_neg_eigval=False, linear_conv_kernel_dim=3,
        rope_parameters={"rope_type": "default", "rope_theta": None})),
    # Kimi Linear (model/kimi_linear.py): KDA layers among NoPE latent attention layers,
    # DeepSeek-V3's experts, in the published form (q/k/v convs in three parts,
    # `block_sparse_moe` with experts' w1/w2/w3, the keys `linear_attn_config`, `num_experts`,
    # `num_expert_group`, ...)
    "kimi-linear": ("KimiLinear", dict(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        linear_attn_config={"full_attn_layers": [2], "kda_layers": [1, 3], "head_dim": 16,
                            "num_heads": 2, "short_conv_kernel_size": 4},
        num_experts=8, num_experts_per_token=2, num_shared_experts=1, moe_intermediate_size=32,
        first_k_dense_replace=1, num_expert_group=2, topk_group=1, routed_scaling_factor=2.0)),
    # BailingHybrid (model/bailing_hybrid.py): KDA layers (full-rank forget and output gates)
    # beside rotated latent attention gated per head, DeepSeek-V3's experts (router biases
    # scrambled), written in the published form (word_embeddings, attention., dense,
    # q/k/v convs in three parts, expert_bias); the KDA head size is head_dim (as the rotary's:
    # transformers writes head_dim = qk_rope_head_dim back)
    "bailing-hybrid": ("BailingHybrid", dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, head_dim=16,
        layer_group_size=2, num_experts=8, num_experts_per_token=2, num_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, num_expert_group=2, topk_group=1,
        routed_scaling_factor=2.0, num_nextn_predict_layers=0, kda_lower_bound=-4.0)),
    # GLM-5-Next (model/glm5_next.py; `WRAPPED`: its Glm5NextForConditionalGeneration, a tiny
    # vision tower not read): a KDA layer (bounded low-rank forget gate, float32 conv in q, k, v
    # parts), then two NoPE latent attention layers (the indexer "full", then "shared": past 19
    # tokens the 4 best whole pools of 4 and the unfinished one; 4 index heads, so that no two
    # pools' scores tie; `write` draws the pools' position logits and gate projection: zeros
    # and ones in transformers' init), mHC streams (2, 4 Sinkhorn steps), a dense MLP then
    # DeepSeek-V3's experts (per expert; router biases scrambled), every SwiGLU clamped at 1
    "glm5-next": ("Glm5Next", dict(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        layer_types=[LIN, "indexed_attention", "indexed_attention"],
        indexer_types=["full", "full", "shared"], mlp_layer_types=["dense", "sparse", "sparse"],
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=0, v_head_dim=16,
        index_n_heads=4, index_head_dim=16, index_topk=16, index_kpool=4, linear_head_dim=16,
        linear_num_heads=2, linear_lower_bound=-4.0, n_routed_experts=8, num_experts_per_tok=2,
        n_group=2, topk_group=1, moe_intermediate_size=32, n_shared_experts=1,
        routed_scaling_factor=2.0, hc_mult=2, hc_sinkhorn_iters=4, swiglu_limit=1.0,
        intermediate_size=96)),
    # Zaya (model/zaya.py): q/k from two convs over a conv state, values half delayed, a
    # float32 residual stream with learned scalings, a router MLP carrying its state from layer
    # to layer over top-1 experts and a skip choice (`write` draws the key scales, the router's
    # balancing biases and the scalings' biases), an LM head with a bias
    "zaya": ("Zaya", dict(
        num_hidden_layers=3, head_dim=16, num_experts=4, moe_intermediate_size=32,
        router_hidden_size=32, cca_time0=2, cca_time1=3, tie_word_embeddings=False,
        lm_head_bias=True)),
    # Inkling (model/inkling.py): no rotary; relative logits (an extent of 12, shorter than the
    # prompts; the window's on the window layer), short convs on k, v and both sublayers'
    # outputs in the conv state; a window layer with twice the KV heads and a dense MLP, then
    # a full layer with its logit scaling from position 4 and routed + shared experts
    # (correction biases scrambled by `write`)
    "inkling": ("InklingText", dict(
        num_hidden_layers=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=4,
        swa_head_dim=16, sliding_window_size=8, d_rel=4, rel_extent=12, local_layer_ids=[0],
        mlp_layer_types=["dense", "sparse"], moe_intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, log_scaling_n_floor=4)),
    # Inkling 2 (model/inkling2.py): Inkling's layers with block attention residuals (blocks of
    # 2 layers), q/k/relative-state L2 clips, per-token sinks, a gated output, the full layer's
    # dynamic k/v convs and log scaling from position 4, softcapped experts, a head narrower
    # than the embedding, soft-capped logits
    "inkling2": ("Inkling2Text", dict(
        num_hidden_layers=3, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=4,
        swa_head_dim=16, sliding_window_size=8, d_rel=4, rel_extent=12,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"], n_layers_per_attn_res_block=2,
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
        log_scaling_n_floor=4, unpadded_vocab_size=290, eos_token_id=2, mlp_gate_softcap=2.0,
        mlp_up_softcap=3.0, final_logit_softcapping=20.0, qk_l2_clip_threshold=3.0,
        rel_l2_clip_threshold=2.0)),
    # Inkling2Loop (model/inkling2.py): Inkling 2's layers 1-2 (one window, one full layer)
    # run three times, each further pass on its own KV caches and conv states, its q/k/v and
    # MLP inputs gated with messages attended from the last pass's blocks; one layer after
    "inkling2-loop": ("Inkling2LoopText", dict(
        num_hidden_layers=4, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=4,
        swa_head_dim=16, sliding_window_size=8, d_rel=4, rel_extent=12,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
        n_layers_per_attn_res_block=1, loop_layer_index_start=1, loop_layer_index_end=3,
        loop_num_passes=3, loop_gate_rank=8, intermediate_size=32, n_routed_experts=4,
        num_experts_per_tok=2, log_scaling_n_floor=4, unpadded_vocab_size=290, eos_token_id=2,
        mlp_gate_softcap=2.0, mlp_up_softcap=3.0, final_logit_softcapping=20.0,
        qk_l2_clip_threshold=3.0, rel_l2_clip_threshold=2.0)),
    # MiniMax-Text-01 (model/minimax.py): lightning attention (Mamba2's scan, chunks of
    # block_size) beside softmax attention, Mixtral's experts, residual weights by sublayer
    "minimax": ("MiniMax", dict(
        num_hidden_layers=3, layer_types=[FULL, LIN, LIN], head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, intermediate_size=32, block_size=8, full_attn_alpha_factor=1.5,
        full_attn_beta_factor=0.9, linear_attn_alpha_factor=1.3, linear_attn_beta_factor=0.7,
        mlp_alpha_factor=1.2, mlp_beta_factor=0.8)),
}  # fmt: skip
# the Gated DeltaNet, KDA and lightning rows (files of their own); `SSM`: the rest (test_hybrid_ssm.py)
DELTA = ("qwen3-next", "qwen3.5", "qwen3.5-moe", "lara-mini", "qwen4-exp", "olmo-hybrid",
         "olmo-hybrid-nope", "kimi-linear", "bailing-hybrid", "glm5-next", "minimax")  # fmt: skip
SSM = tuple(name for name in CASES if name not in DELTA)
# rows whose router correction biases (buffers: zeros) `write` scrambles, large enough to change
# the picks
SCRAMBLED = (
    "nemotron-h-moe",
    "lfm2-moe",
    "bailing-hybrid",
    "glm5-next",
    "inkling",
    "inkling2",
    "inkling2-loop",
)
# config class prefix -> (the multimodal wrapper `write` builds around the text config, its
# tiny vision config: not read)
WRAPPED = {"Glm5Next": ("Glm5NextForConditionalGeneration",
                        dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                             out_hidden_size=64, projection_intermediate_size=32))}  # fmt: skip
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
    "mamba1": CASES["mamba1"],  # Mamba-1's mixers by channels of d_inner, the vocab tied
    "falcon-mamba": CASES["falcon-mamba"],  # its weightless dt/B/C norms after the all-reduce
    "zamba": CASES["zamba"],  # its Mamba-1 mixers by heads, the shared block by heads, width
    "zamba2": CASES["zamba2"],  # two shared blocks, their uses' adapters' B split with them
    "lfm2": CASES["lfm2"],  # the short convs by channels, attention by heads (q/k norms)
    "lfm2-moe": CASES["lfm2-moe"],  # the experts by width, the router whole
    "lfm3": CASES["lfm3"],  # sliding and full layers, each head's output gate with its heads
    "recurrent-gemma": CASES["recurrent-gemma"],  # the RG-LRU by gate blocks, its KV head replicated
    "zaya": CASES["zaya"],  # its conv state by heads (the delayed values whole), experts by width
    "inkling": CASES["inkling"],  # heads with their relative logits, each layer's KV heads
    # (the window layer's two a rank, the full layer's one replicated), the experts by width
    "inkling2-loop": CASES["inkling2-loop"],  # Inkling's split, its sinks, gate and dynamic
    # taps with their heads; the block residuals and loop gates whole; the head by vocabulary
}  # fmt: skip


def write(name: str, path):
    """Case `name`'s checkpoint (`make_tiny_model`) saved to `path`; the transformers model."""
    arch, overrides = CASES[name]
    if arch in WRAPPED:  # (seed, scale and tokenizer as make_tiny_model's)
        import transformers

        cls, vision = WRAPPED[arch]
        text = dict(TINY, pad_token_id=0) | overrides
        config = getattr(transformers, f"{arch}Config")(text_config=text, vision_config=vision)
        model = make_tiny_wrapped(path, cls, config)
    else:
        model = make_tiny_model(path, arch, **overrides)
    if name == "qwen4-exp":  # its PLE conv starts at zeros (transformers' init): drawn here
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith("ple.conv1d.weight"):
                    p.copy_(torch.randn(p.shape, generator=g))
        model.save_pretrained(path)
    if name == "glm5-next":  # its k-pool indexer's ape and gate: zeros and ones, drawn here
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith(("index_kpool_compress_ape", "index_kpool_compress_gate")):
                    p.copy_(torch.randn(p.shape, generator=g))
        model.save_pretrained(path)
    if name in SCRAMBLED:
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for key, buf in model.named_buffers():
                if key.endswith(("e_score_correction_bias", "expert_bias")):
                    buf.copy_(torch.randn(buf.shape, generator=g))
        model.save_pretrained(path)
    if name in ("inkling2", "inkling2-loop"):  # the residuals' queries start at zeros: drawn
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith(".query"):
                    p.copy_(torch.randn(p.shape, generator=g))
        model.save_pretrained(path)
    if name == "zaya":
        _zaya_draws(model)
        model.save_pretrained(path)
    return model


def _zaya_draws(model) -> None:
    """Zaya's key scales in [1, 2] (zeros: every key alike), the biases of its residual
    scalings small (else they outweigh the layers), the router MLP's matrices 5 times larger
    (else its biases pick one expert for every token) and balancing biases: every expert and
    the skip choice picked in prompt 0."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("qk_norm.temp"):
                p.copy_(1 + torch.rand(p.shape, generator=g))
            if key.endswith(("residual_scale.hidden_states_bias", "residual_scale.residual_bias",
                             "input_hidden_states_bias")):  # fmt: skip
                p.mul_(0.1)
            if ".router_mlp." in key and p.dim() > 1:
                p.mul_(5)
        for key, buf in model.named_buffers():
            if key.endswith("balancing_biases"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=g))


class Built:
    """The `built` fixture's cache: `built(name)` -> (checkpoint directory, transformers model,
    loaded checkpoint, transformers' greedy tokens and logits of `prompts()`), each written
    once (`write`, or `writer(path)` for a case outside `CASES`) into a directory of
    `tmp_path_factory`; `reference=False` leaves the tokens to a later call that asks (None
    until then)."""

    def __init__(self, tmp_path_factory) -> None:
        self.tmp = tmp_path_factory
        self.done: dict[str, list] = {}

    def __call__(self, name: str, writer=None, reference: bool = True):
        from pagoda.runtime.model.loader import load_model

        if name not in self.done:
            path = self.tmp.mktemp(name)
            model = writer(path) if writer is not None else write(name, path)
            self.done[name] = [path, model, load_model(str(path)), None]
        entry = self.done[name]
        if reference and entry[3] is None:
            entry[3] = hf_greedy_plain_batch(entry[1], prompts(), NEW)
        return tuple(entry)


# what `pagoda serve` refuses in one line at start, for the rows whose layers it does not split
# or run in FP8 (runtime/family_options.py): (a tensor parallel size, its message;
# `start_checks.check_dtype`'s for FP8, a pattern)
_DELTA_TP = "--tensor-parallel-size 4 does not divide the Gated DeltaNet key heads "
_DELTA_TP += "(linear_num_key_heads 2)"
_KDA_TP = "--tensor-parallel-size 4 does not divide the KDA heads ({})"
_NO_TP = "--tensor-parallel-size 2 is not supported for a {} model ({} layers)"
_NO_CHANNELS = "--tensor-parallel-size 3 does not divide the Mamba mixers' channels "
_NO_CHANNELS += "(mamba d_inner 128)"
_NO_HEADS = "--tensor-parallel-size 3 does not divide the model's 4 attention heads"
_NO_FP8 = r"fp8 is not supported for a {} model \({} layers\)"
REFUSED = {
    "qwen3-next": (4, _DELTA_TP, _NO_FP8.format("qwen3_next", "gated_deltanet")),
    "qwen3.5": (4, _DELTA_TP, _NO_FP8.format("qwen3_5", "gated_deltanet")),
    "lara-mini": (4, _DELTA_TP, _NO_FP8.format("lara_mini", "gated_deltanet")),
    "olmo-hybrid": (4, _DELTA_TP, _NO_FP8.format("olmo_hybrid", "gated_deltanet")),
    "qwen4-exp": (4, _DELTA_TP, _NO_FP8.format("qwen4_exp", "gated_deltanet")),
    "kimi-linear": (4, _KDA_TP.format(2), _NO_FP8.format("kimi_linear", "kda")),
    "bailing-hybrid": (  # (its KDA heads are the attention's)
        3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
        _NO_FP8.format("bailing_hybrid", "kda"),
    ),
    "glm5-next": (4, _KDA_TP.format(2), _NO_FP8.format("glm5_next", "kda")),
    "minimax": (  # (its lightning heads are the attention's)
        3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
        _NO_FP8.format("minimax", "lightning"),
    ),
    "jamba": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
              _NO_FP8.format("jamba", "mamba1")),
    "mamba1": (3, _NO_CHANNELS, _NO_FP8.format("mamba", "mamba1")),
    "falcon-mamba": (3, _NO_CHANNELS, _NO_FP8.format("falcon_mamba", "mamba1")),
    "lfm2": (3, _NO_HEADS, _NO_FP8.format("lfm2", "short_conv")),
    "lfm2-bias": (3, _NO_HEADS, _NO_FP8.format("lfm2", "short_conv")),
    "lfm3": (3, _NO_HEADS, _NO_FP8.format("lfm3", "short_conv")),
    "zamba2": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
               "fp8 is not supported for a zamba2 model"),
    "zamba": (4, "--tensor-parallel-size 4 does not divide the Mamba heads (n_mamba_heads 2)",
              "fp8 is not supported for a zamba model"),
    "zaya": (4, "--tensor-parallel-size 4 does not divide zaya's KV heads (num_key_value_heads 2)",
             "fp8 is not supported for a zaya model"),
    "recurrent-gemma": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
                        _NO_FP8.format("recurrent_gemma", "rglru")),
    "rwkv": (3, "--tensor-parallel-size 3 does not divide the model's MLP width (128)",
             _NO_FP8.format("rwkv", "wkv")),
    "xlstm": (4, "--tensor-parallel-size 4 does not divide the mLSTM heads (num_heads 2)",
              _NO_FP8.format("xlstm", "mlstm")),
    "inkling": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
                "fp8 is not supported for a inkling model"),
    "inkling2": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
                 "fp8 is not supported for a inkling2 model"),
    "inkling2-loop": (3, "--tensor-parallel-size 3 does not divide the model's 4 attention heads",
                      "fp8 is not supported for a inkling2 model"),
}  # fmt: skip


def check_refused(name: str, mc) -> None:
    """`REFUSED[name]`: the tensor parallel size refused (`layout.check`, as `pagoda serve`
    runs it before it binds) and FP8 (`start_checks.check_dtype`, given what it reads of a config: a
    CPU refuses an FP8 EngineConfig itself outside Triton's interpreter), each in one line."""
    import re
    from types import SimpleNamespace

    import pytest
    from pagoda.runtime.distributed.layout import check as tp_check
    from pagoda.runtime.engine.start_checks import check_dtype

    size, tp_message, fp8_pattern = REFUSED[name]
    with pytest.raises(ValueError, match=re.escape(tp_message)):
        tp_check(mc, size)
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)
    with pytest.raises(ValueError, match=fp8_pattern):
        check_dtype(fp8, mc)


def check_missing_refused(loaded, names) -> None:
    """The checkpoint check (`checkpoint_check.check_checkpoint`) passes `loaded`'s tensors'
    headers, and refuses them without any one of `names`, naming it."""
    import re

    import pytest
    from pagoda.runtime.model.checkpoint_check import check_checkpoint

    headers = {n: loaded.weights.dtype_and_shape(n) for n in loaded.weights}
    check_checkpoint(loaded.config, headers)
    for gone in names:
        short = {n: v for n, v in headers.items() if n != gone}
        with pytest.raises(ValueError, match=re.escape(f"missing tensor '{gone}'")):
            check_checkpoint(loaded.config, short)
