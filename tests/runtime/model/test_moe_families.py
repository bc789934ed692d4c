"""The MoE families below against transformers, token for token and logits within 1e-3
(float32), on tiny random checkpoints transformers writes itself: prompts chunked into 16-token
steps, three prompts sharing steps, a warm prefix cache, and a pool small enough to preempt; the
config fields as transformers reads them, the weights estimate against what the built model
holds, the tensors a checkpoint may not lack, two tensor-parallel ranks (gloo: a case a layout,
`TWO_RANKS`) and, on CUDA, the fused-MoE kernel with CUDA graphs: one table of cases, shared checks, then each family's own
(their published configs read alone, with no checkpoint: test_moe_family_configs.py).

- ernie45-moe (`Ernie4_5_MoeForCausalLM`): the interleaved float32 rotary of dense ERNIE 4.5, a
  dense first layer, then a float32 softmax router whose choice adds a correction bias large
  enough to change the picks (`moe_statics.e_score_correction_bias`, [1, E]), weights from the
  uncorrected probabilities, renormalised, beside two shared experts; tied embeddings;
  ernie45-moe-interval: experts in every second layer up to `moe_layer_end_index` (1 and 3 of
  5), one shared expert, top-3, an untied head.
- hunyuan-moe (`HunYuanMoEV1ForCausalLM`): per-head q/k norms after rotary, the NTK-alpha rotary
  (a "dynamic" rotary with `alpha`: a larger base), experts in every layer (float32 softmax
  router, top-2 renormalised) beside the shared MLP; hunyuan-moe-lists: the released configs'
  per-layer lists (`moe_topk`, `moe_intermediate_size`, `num_shared_expert`), top-3, the default
  rotary; hunyuan-dense (`HunYuanDenseV1ForCausalLM`: Hunyuan-0.5B..7B), tied embeddings, the
  NTK-alpha rotary.
- dots1 (`Dots1ForCausalLM`): per-head q/k norms, a dense first layer, then V3's router
  (sigmoid, a correction bias large enough to change the picks, 4 groups of which 2,
  renormalised, scaled by 2) and one shared expert; a sliding window on the layers from
  `max_window_layers` on (prompts longer than it); dots1-flat: one group, not renormalised, two
  shared experts, experts from the first layer on, q/k/v biases, no window.
- minimax-m2 (`MiniMaxM2ForCausalLM`): q and k normalised over their whole projections, half of
  each head rotating (the released configs' `rotary_dim`), top-2 of 8 experts by sigmoid scores
  with a correction bias large enough to change the picks, renormalised; minimax-m2-full: the
  whole head rotating, top-3 of 6, one KV head.
- phimoe (`PhimoeForCausalLM`: Phi-3.5-MoE): LayerNorms with biases, q/k/v/o biases, an LM head
  bias, sparsemixer's two experts of 8 (a jitter eps wide enough that the softmax of each pick
  spans several logits), LongRoPE with PhiMoE's `short_mscale` (the prompts within the original
  context); phimoe-window: no biases, a sliding window on every layer, the default jitter eps,
  the plain rotary.
- exaone-moe (`ExaoneMoeForCausalLM`: K-EXAONE): per-head q/k norms, hybrid attention (every
  second layer global and without rotary, the others in a window shorter than the prompts), a
  dense first layer, then V3's router (sigmoid, a correction bias, 4 groups of which 2,
  renormalised, scaled by 2.5) beside a shared expert; exaone-moe-types: `layer_types` given
  (one rotating window layer between two NoPE global ones, the window the default 4096), dense
  layers by `mlp_layer_types`, one group, not renormalised, two shared experts.
- flex-olmo (`FlexOlmoForCausalLM`): OLMo 2's layer (norms after, whole-projection q/k norms)
  with OLMoE's experts, top-2 of 4, not renormalised; flex-olmo-norm: top-3 of 6, renormalised,
  three layers.
- afmoe (`AfmoeForCausalLM`: Trinity): four norms a layer, per-head q/k norms, attention's output
  gated by a sigmoid, window layers (shorter than the prompts) rotating and every second layer
  global without rotary, a dense first layer, then experts by sigmoid scores with a choice-only
  bias large enough to change the picks, renormalised and scaled by `route_scale`, beside two
  shared experts; afmoe-mup: the muP embedding scale (sqrt(hidden_size)), every layer a window
  layer, experts from the first layer on, one shared expert.
- granitemoe-shared (`GraniteMoeSharedForCausalLM`): GraniteMoe's scalars and stacked experts
  (top-2 of 4) with the ungated `shared_mlp` beside them, its width other than the experts'.
- granitemoe-swa (`GraniteMoeSWAForCausalLM`): GraniteMoeShared's model with window layers
  (`layer_types`, prompts longer than the window) and a sink logit per head (drawn at random).
- kolibri1 (`Kolibri1ForCausalLM`): EXAONE 4's attention (per-head q/k norms, window layers
  rotating, the full one NoPE), GLM-4's norms after attention and the MLP (published as
  `post_attn_norm` / `post_ffn_norm`), top-2 of 6 experts by the logits plus a choice-only bias
  (`moe.router.expert_bias`, drawn large enough to change the picks) weighted by their sigmoid
  scores, not renormalised, beside a shared MLP.
- axk1 (`AXK1ForCausalLM`: A.X-K1): DeepSeek-V3's latent attention (the q bottleneck, the
  interleaved rotary) and grouped sigmoid router (a correction bias large enough to change the
  picks, 2 groups of which 1, scaled by 2) with the shared expert, an RMSNorm on each MoE
  block's output; a dense first layer. Without its correction biases (as A.X-K1 is released)
  it routes as transformers does, with none.
- dbrx (`DbrxForCausalLM`): MPT's bias-free LayerNorms and stacked `Wqkv` clamped by a
  `clip_qkv` small enough to clamp, the rotary, two KV heads, top-2 of 4 experts renormalised
  (their stacked `w1` / `v1` / `w2` listed per expert); dbrx-plain: a clamp too wide to act
  (transformers' DBRX fails without one), one KV head, top-3 of 6 not renormalised
  (`moe_normalize_expert_weights` null).
- solar-open (`SolarOpenForCausalLM`): GLM-4.5's model without q/k norms, experts from the
  first layer on: V3's router (sigmoid, a correction bias large enough to change the picks, 4
  groups of which 2, renormalised, scaled by 2) beside one shared expert, the whole head
  rotating.
- minicpm5-moe (`MiniCPM5MoeForCausalLM`): GLM-4.5's model with Llama's attention gated as
  Qwen3-Next's (q_proj gives each head's query, then its gate), a dense first layer, then 3 of
  8 experts in 2 groups (one kept) with correction biases large enough to change the picks,
  scaled by 2.5, beside two shared experts' width; its published config (the older
  architecture name, `first_k_dense_replace`) with transformers' parameter count.
- mellum (`MellumForCausalLM`): Qwen3-MoE's layers (per-head q/k norms, softmax-routed
  experts renormalised) as Laguna's decoder arranges them: sliding layers (a 9-key window,
  their own base) around a full one (its base), a dense MLP between two
  expert layers; its published config with transformers' parameter count.
- flint (`FlintForCausalLM`): Qwen3-MoE's layers with gpt-oss's attention sinks (stored as
  `softmax_offset`, drawn wide), rotary on the sliding layers (a 9-key window) only, the full
  one NoPE; a float32 router (drawn: transformers zeroes it) by sigmoid scores renormalised,
  beside an ungated shared expert; a dense MLP on `mlp_only_layers`.
- cohere2-moe (`Cohere2MoeForCausalLM`): Cohere 2's layer (one LayerNorm, attention and the MLP
  side by side, the interleaved rotary on the window layers, NoPE global ones, `logit_scale`)
  with a dense first layer of its own width (rotating: `prefix_dense_sliding_window_pattern`
  1), then top-2 of 4 experts by the softmax of their logits averaged with a shared expert;
  cohere2-moe-rms: Llama's RMSNorm (`rms_norm_eps`), experts in every layer by sigmoids
  renormalised, summed with two shared experts, an untied head.
- hy-v3 (`HYV3ForCausalLM`: Hy3): per-head q/k norms, a dense first layer, then experts by
  sigmoid scores with a choice-only `expert_bias` large enough to change the picks,
  renormalised and scaled by `router_scaling_factor`, beside the shared MLP; written under
  the released names (`mlp.router.gate`, `mlp.expert_bias`, `mlp.shared_mlp`).
- jetmoe (`JetMoeForCausalLM`): the mixture of attention heads (top-2 of 4 attention experts'
  query and output projections over a shared kv_proj of two KV heads) and top-2 of 4 stacked
  experts, both with output biases, routers drawn wide enough that the picks vary by token, the
  layers' norms at eps 1e-6 beside a final rms_norm_eps of 0.1 (wide enough to change the
  tokens were the layers' norms to read it), on two ranks too (a KV head, its experts' query
  heads and output columns a rank); jetmoe-top3: top-3 of 6, one KV head, three layers, an
  untied head. 16 bits: FP8 is refused.
- beam (`BeamForCausalLM`: Reflection AI's Beam): per-head q/k norms, window layers (shorter
  than the prompts) rotating beside NoPE full-attention layers whose q is scaled by position,
  attention's output gated per head element with a per-head bias, four norms a layer and
  depth-scaled residual adds, dense and expert layers by `mlp_layer_types` (V3's router: a
  correction bias large enough to change the picks, 2 groups of which 1, scaled by 2.5; no
  shared expert), the logits soft-capped at 6.
- aria-text (`AriaTextForCausalLM`: Aria's language model): Llama's attention, experts in every
  layer stacked as transformers keeps them for `grouped_mm` ([E, hidden, 2N], [E, N, hidden],
  read transposed), picked by the top-k router logits weighted by their softmax, beside an
  ungated shared MLP of two experts' width.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from arch_cases import (
    FULL,
    SLIDING,
    built_fixture,
    case_fixture,
    check_two_ranks,
    fused_moe_at,
    gpu_test,
    greedy_test,
)
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
# Hunyuan's released NTK-alpha rotary
ALPHA = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 128,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0, 9.0, 10.0, 12.0, 16.0],
            "short_mscale": 1.2, "long_mscale": 1.4}  # fmt: skip
# the tensors of each layer drawn at random (seed 2, layer by layer, times the scale) before the
# checkpoint is saved: correction biases large enough to change the experts picked, and AfMoE's
# routers (which transformers initialises to zero); a layer without one is left alone
ERNIE_BIAS = (("mlp.gate.moe_statics.e_score_correction_bias", 0.3),)
V3_BIAS = (("mlp.gate.e_score_correction_bias", 1.0),)
MINIMAX_BIAS = (("mlp.e_score_correction_bias", 1.0),)
AFMOE_ROUTER = (("mlp.router.gate.weight", 1.0), ("mlp.expert_bias", 1.0))
BEAM_BIASES = (("mlp.gate.e_score_correction_bias", 1.0), ("self_attn.gate_bias", 1.0))
# JetMoE's routers (attention's and the MLP's), drawn wide enough that the picks vary by token
JETMOE_ROUTERS = (
    ("self_attention.experts.router.layer.weight", 1.0),
    ("mlp.router.layer.weight", 1.0),
)
# GraniteMoeSWA's sink logits (transformers initialises them to zero)
SINKS = (("self_attn.sinks", 1.0),)
# Kolibri 1's choice-only bias, added to the logits (large enough to change the picks)
KOLIBRI_BIAS = (("mlp.gate.e_score_correction_bias", 2.0),)
INDEXED = "indexed_attention"  # (Kolibri 1.1's)
# DBRX's base both where transformers reads it and where its released configs keep it
DBRX_ROPE = dict(rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
B, E, P = dict(bos_token_id=1, eos_token_id=2), dict(eos_token_id=2), dict(pad_token_id=0)
# Flint's sinks and router drawn: transformers initialises the router to zero (every expert
# alike) and the sinks small
FLINT_DRAWN = (("self_attn.sinks", 1.0), ("mlp.gate.weight", 1.0))
# Mellum's rotary by layer kind (each its own base)
MELLUM_ROPE = {FULL: {"rope_type": "default", "rope_theta": 500000.0},
               SLIDING: {"rope_type": "default", "rope_theta": 1000.0}}  # fmt: skip
# name: (transformers config class prefix, config overrides, tensors drawn at random)
CASES = {
    "ernie45-moe": ("Ernie4_5_Moe", dict(
        moe_num_experts=8, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
        moe_layer_start_index=1, num_hidden_layers=3), ERNIE_BIAS),
    "ernie45-moe-interval": ("Ernie4_5_Moe", dict(
        moe_num_experts=6, moe_k=3, moe_intermediate_size=24, moe_num_shared_experts=1,
        moe_layer_start_index=0, moe_layer_end_index=3, moe_layer_interval=2,
        num_hidden_layers=5, tie_word_embeddings=False), ERNIE_BIAS),
    "hunyuan-moe": ("HunYuanMoEV1", dict(
        num_experts=8, moe_topk=2, intermediate_size=48, head_dim=16, rope_parameters=ALPHA), ()),
    "hunyuan-moe-lists": ("HunYuanMoEV1", dict(
        num_experts=6, moe_topk=[3, 3], intermediate_size=32, moe_intermediate_size=[32, 32],
        num_shared_expert=[1, 1], use_mixed_mlp_moe=True, use_qk_norm=True, head_dim=16), ()),
    "hunyuan-dense": ("HunYuanDenseV1", dict(
        head_dim=32, num_attention_heads=2, tie_word_embeddings=True, rope_parameters=ALPHA), ()),
    "dots1": ("Dots1", dict(
        head_dim=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        routed_scaling_factor=2.0, norm_topk_prob=True, n_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, num_hidden_layers=3,
        sliding_window=11, max_window_layers=1), V3_BIAS),
    "dots1-flat": ("Dots1", dict(
        head_dim=16, n_routed_experts=6, num_experts_per_tok=3, n_group=1, topk_group=1,
        routed_scaling_factor=1.5, norm_topk_prob=False, n_shared_experts=2,
        moe_intermediate_size=24, first_k_dense_replace=0, attention_bias=True,
        sliding_window=None), V3_BIAS),
    "minimax-m2": ("MiniMaxM2", dict(
        num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=32,
        rotary_dim=16, num_hidden_layers=3, **B), MINIMAX_BIAS),
    "minimax-m2-full": ("MiniMaxM2", dict(
        num_local_experts=6, num_experts_per_tok=3, intermediate_size=24, head_dim=16,
        num_key_value_heads=1, **B), MINIMAX_BIAS),
    "phimoe": ("Phimoe", dict(
        num_local_experts=8, intermediate_size=32, head_dim=16, attention_bias=True,
        lm_head_bias=True, router_jitter_noise=0.3, num_hidden_layers=3,
        rope_parameters=LONGROPE), ()),
    "phimoe-window": ("Phimoe", dict(
        num_local_experts=6, intermediate_size=24, sliding_window=11), ()),
    "exaone-moe": ("ExaoneMoe", dict(
        head_dim=32, num_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, num_shared_experts=1,
        moe_intermediate_size=32, first_k_dense_replace=1, num_hidden_layers=4,
        sliding_window=11, sliding_window_pattern=2, **E), V3_BIAS),
    "exaone-moe-types": ("ExaoneMoe", dict(
        head_dim=16, num_experts=6, num_experts_per_tok=3, norm_topk_prob=False,
        routed_scaling_factor=1.0, num_shared_experts=2, moe_intermediate_size=24,
        num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"],
        layer_types=[FULL, SLIDING, FULL], **E), V3_BIAS),
    "flex-olmo": ("FlexOlmo", dict(
        num_experts=4, num_experts_per_tok=2, intermediate_size=32, **P, **E), ()),
    "flex-olmo-norm": ("FlexOlmo", dict(
        num_experts=6, num_experts_per_tok=3, intermediate_size=24, norm_topk_prob=True,
        num_hidden_layers=3, **P, **E), ()),
    "afmoe": ("Afmoe", dict(
        head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        num_shared_experts=2, num_dense_layers=1, route_scale=2.0, num_hidden_layers=4,
        sliding_window=11, global_attn_every_n_layers=2, **B, **P), AFMOE_ROUTER),
    "afmoe-mup": ("Afmoe", dict(
        head_dim=16, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
        num_shared_experts=1, num_dense_layers=0, mup_enabled=True, sliding_window=40,
        global_attn_every_n_layers=8, **B, **P), AFMOE_ROUTER),
    "granitemoe-shared": ("GraniteMoeShared", dict(
        num_local_experts=4, intermediate_size=32, shared_intermediate_size=48,
        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
        logits_scaling=2.0, **E), ()),
    "granitemoe-swa": ("GraniteMoeSWA", dict(
        num_hidden_layers=3, num_local_experts=4, intermediate_size=32,
        shared_intermediate_size=48, embedding_multiplier=2.0, residual_multiplier=0.5,
        attention_multiplier=0.2, logits_scaling=2.0, sliding_window=10,
        layer_types=[SLIDING, FULL, SLIDING], **E), SINKS),
    "kolibri1": ("Kolibri1", dict(
        num_hidden_layers=3, head_dim=16, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, sliding_window=10,
        layer_types=[SLIDING, FULL, SLIDING], **E), KOLIBRI_BIAS),
    # Kolibri 1.1: sliding, indexed (dense MLP), sliding, indexed reading layer 1's KV cache;
    # the indexed layers' selection past 7 keys (the 4 best by 2 heads, 1 sink, 2 local: ties
    # of relu'd zero scores common) from a pool of the 4 best blocks of 4 past 16 keys, picked
    # by layer 1 (`index_layers`) and reused by layer 3
    "kolibri1_1": ("Kolibri1_1", dict(
        num_hidden_layers=4, head_dim=16, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, sliding_window=10,
        layer_types=[SLIDING, INDEXED, SLIDING, INDEXED], kv_source_layers=[0, 1, 2, 1],
        index_layers=[1], index_num_heads=2, mlp_only_layers=[1], mlp_only_intermediate_size=96,
        index_topk=4, index_num_local_tokens=2, index_num_sink_tokens=1, index_pool_size=16,
        index_compression=4, **E), KOLIBRI_BIAS),
    "axk1": ("AXK1", dict(
        num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, n_group=2, topk_group=1,
        routed_scaling_factor=2.0, mlp_layer_types=["dense", "sparse", "sparse"], **E), V3_BIAS),
    "dbrx": ("Dbrx", dict(
        d_model=64, n_heads=4, n_layers=2, **DBRX_ROPE,
        attn_config=dict(kv_n_heads=2, clip_qkv=0.3, rope_theta=50000.0),
        ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2), **E), ()),
    "dbrx-plain": ("Dbrx", dict(
        d_model=64, n_heads=4, n_layers=2, **DBRX_ROPE,
        attn_config=dict(kv_n_heads=1, clip_qkv=100.0, rope_theta=50000.0),
        ffn_config=dict(ffn_hidden_size=24, moe_num_experts=6, moe_top_k=3,
                        moe_normalize_expert_weights=None), **E), ()),
    "solar-open": ("SolarOpen", dict(
        head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        routed_scaling_factor=2.0, n_shared_experts=1, moe_intermediate_size=32,
        **B), V3_BIAS),
    "minicpm5-moe": ("MiniCPM5Moe", dict(
        head_dim=16, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, n_shared_experts=2, moe_intermediate_size=24,
        mlp_layer_types=["dense", "sparse", "sparse"], num_hidden_layers=3, **B, **P), V3_BIAS),
    "mellum": ("Mellum", dict(
        head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
        num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING], sliding_window=9,
        mlp_layer_types=["sparse", "dense", "sparse"], rope_parameters=MELLUM_ROPE, **B), ()),
    "flint": ("Flint", dict(
        head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
        shared_expert_intermediate_size=40, num_hidden_layers=3, mlp_only_layers=[1],
        layer_types=[SLIDING, FULL, SLIDING], sliding_window=9, **B), FLINT_DRAWN),
    "cohere2-moe": ("Cohere2Moe", dict(
        head_dim=16, num_experts=4, num_experts_per_tok=2, intermediate_size=32,
        prefix_dense_intermediate_size=48, first_k_dense_replace=1, num_shared_experts=1,
        sliding_window=11, sliding_window_pattern=2, num_hidden_layers=4, logit_scale=0.5,
        **B, **P), ()),
    "cohere2-moe-rms": ("Cohere2Moe", dict(
        head_dim=16, num_experts=6, num_experts_per_tok=3, intermediate_size=24,
        rms_norm_eps=1e-6, expert_selection_fn="sigmoid", num_shared_experts=2,
        shared_expert_combination_strategy="sum", sliding_window=11, sliding_window_pattern=2,
        tie_word_embeddings=False, **B, **P), ()),
    "hy-v3": ("HYV3", dict(
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        router_scaling_factor=2.5, num_hidden_layers=3, **B), MINIMAX_BIAS),
    "jetmoe": ("JetMoe", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, kv_channels=16,
        rms_norm_eps=0.1, **E), JETMOE_ROUTERS),
    "jetmoe-top3": ("JetMoe", dict(
        num_local_experts=6, num_experts_per_tok=3, intermediate_size=24, kv_channels=32,
        num_key_value_heads=1, num_hidden_layers=3, tie_word_embeddings=False, **E),
        JETMOE_ROUTERS),
    "beam": ("Beam", dict(
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_group=2,
        topk_group=1, num_hidden_layers=4, sliding_window=11, final_logit_softcapping=6.0,
        layer_types=[SLIDING, FULL, SLIDING, FULL],
        mlp_layer_types=["dense", "sparse", "sparse", "dense"], **P), BEAM_BIASES),
    "aria-text": ("AriaText", dict(
        moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2, intermediate_size=32,
        num_hidden_layers=3, tie_word_embeddings=False), ()),
}  # fmt: skip
# the config as the engine reads it, per case: "a.b" is `read_model_config(...).a.b` (or
# `["b"]` where `a` is a dict)
FIELDS = {
    "ernie45-moe-interval": {
        "architecture": "ernie4_5_moe", "family.rope_interleaved": True,
        "tie_word_embeddings": False, "family.moe_layers": (False, True, False, True, False),
        "family.routing.scoring": "softmax", "family.routing.topk_method": "greedy",
        "family.routing.bias": True, "family.shared_expert_intermediate_size": 24,
        "family.num_experts_per_tok": 3},
    # the NTK-alpha rotary as transformers computes it: a base of theta x alpha ** (d / (d - 2)),
    # no scaling left
    "hunyuan-moe": {
        "rope_scaling": None, "rope_theta": pytest.approx(10000.0 * 1000.0 ** (16 / 14)),
        "family.num_experts": 8, "family.num_experts_per_tok": 2,
        "family.moe_intermediate_size": 48, "family.shared_expert_intermediate_size": 48,
        "family.routing.bias": False},
    "hunyuan-moe-lists": {"family.num_experts_per_tok": 3},
    "dots1": {
        "architecture": "dots1", "family.qk_norm": True, "rope_scaling": None,
        "family.sliding_window": 11, "family.window_layers": (False, True, True),
        "family.moe_layers": (False, True, True), "family.shared_expert_intermediate_size": 32,
        "family.routing.scoring": "sigmoid", "family.routing.topk_method": "noaux_tc",
        "family.routing.n_group": 4, "family.routing.topk_group": 2},
    "minimax-m2": {
        "architecture": "minimax_m2", "family.qk_norm_whole": True,
        "rope_scaling.partial_rotary_factor": 0.5, "family.routing.bias": True},
    "phimoe": {
        "architecture": "phimoe", "family.layer_norm_bias": True, "attention_bias": True,
        "family.routing.topk_method": "sparsemixer", "family.routing.jitter_eps": 0.3,
        "family.num_experts_per_tok": 2},
    "exaone-moe": {
        "family.qk_norm": True, "family.sliding_window": 11,
        "family.window_layers": (True, False, True, False),
        "family.rope_layers": (True, False, True, False),
        "family.moe_layers": (False, True, True, True), "family.routing.bias": True},
    "exaone-moe-types": {
        "family.sliding_window": 4096, "family.rope_layers": (False, True, False),
        "family.moe_layers": (True, False, True), "family.shared_expert_intermediate_size": 48},
    "flex-olmo-norm": {
        "family.olmo2_norms": True, "family.qk_norm_whole": True, "family.norm_topk_prob": True,
        "family.num_experts": 6},
    "afmoe": {
        "family.window_layers": (True, False, True, False),
        "family.rope_layers": (True, False, True, False),
        "family.moe_layers": (False, True, True, True),
        "family.routing.routed_scaling_factor": 2.0, "family.embedding_multiplier": 1.0},
    "afmoe-mup": {"family.embedding_multiplier": 8.0},
    "dbrx": {
        "architecture": "dbrx", "num_kv_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
        "family.clip_qkv": 0.3, "family.falcon_qkv": "stacked", "family.num_experts": 4,
        "family.num_experts_per_tok": 2, "family.moe_intermediate_size": 32,
        "family.norm_topk_prob": True, "tie_word_embeddings": False},
    "dbrx-plain": {"num_kv_heads": 1, "family.norm_topk_prob": False},
    "solar-open": {
        "architecture": "solar_open", "family.qk_norm": False, "rope_scaling": None,
        "family.moe_layers": (True, True), "family.shared_expert_intermediate_size": 32,
        "family.routing.n_group": 4, "family.routing.bias": True},
    "minicpm5-moe": {
        "architecture": "minicpm5_moe", "family.qk_norm": False, "rope_scaling": None,
        "family.moe_layers": (False, True, True), "family.shared_expert_intermediate_size": 48,
        "family.routing.n_group": 2, "family.routing.bias": True,
        "family.routing.routed_scaling_factor": 2.5},
    "mellum": {
        "architecture": "mellum", "family.qk_norm": True, "rope_theta": 500000.0,
        "rope_scaling": None, "family.local_rope_theta": 1000.0,
        "family.sliding_window": 9, "family.window_layers": (True, False, True),
        "family.moe_layers": (True, False, True), "family.num_experts": 6,
        "family.norm_topk_prob": True, "family.routing": None},
    "flint": {
        "architecture": "flint", "family.qk_norm": True, "family.attention_sinks": True,
        "family.sliding_window": 9, "family.window_layers": (True, False, True),
        "family.rope_layers": (True, False, True), "family.moe_layers": (True, False, True),
        "family.routing.scoring": "sigmoid", "family.routing.bias": False,
        "family.shared_expert_intermediate_size": 40},
    "cohere2-moe": {
        "architecture": "cohere2_moe", "family.cohere_rms_norm": False, "rms_norm_eps": 1e-5,
        "intermediate_size": 48, "family.moe_intermediate_size": 32,
        "family.moe_layers": (False, True, True, True),
        "family.window_layers": (False, True, False, True),
        "family.rope_layers": (True, True, False, True), "family.shared_expert_average": True,
        "family.routing.scoring": "softmax", "tie_word_embeddings": True},
    "cohere2-moe-rms": {
        "family.cohere_rms_norm": True, "rms_norm_eps": 1e-6, "family.moe_layers": (True, True),
        "family.routing.scoring": "sigmoid", "family.shared_expert_average": False,
        "family.shared_expert_intermediate_size": 48},
    "hy-v3": {
        "architecture": "hy_v3", "family.qk_norm": True, "family.moe_layers": (False, True, True),
        "family.routing.scoring": "sigmoid", "family.routing.bias": True,
        "family.routing.routed_scaling_factor": 2.5, "family.shared_expert_intermediate_size": 32},
    "jetmoe": {
        "architecture": "jetmoe", "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "rms_norm_eps": 0.1, "family.num_experts": 4, "family.num_experts_per_tok": 2,
        "family.moe_intermediate_size": 32, "family.norm_topk_prob": True,
        "tie_word_embeddings": True},
    "jetmoe-top3": {"num_heads": 3, "num_kv_heads": 1, "head_dim": 32,
                    "tie_word_embeddings": False},
    "granitemoe-swa": {
        "architecture": "granitemoe_swa", "family.shared_expert_intermediate_size": 48,
        "family.window_layers": (True, False, True), "family.attention_sinks": True,
        "family.rope_thetas": (10000.0,) * 3, "family.attention_multiplier": 0.2},
    "kolibri1": {
        "architecture": "kolibri1", "family.qk_norm": True, "family.glm4_norms": True,
        "family.window_layers": (True, False, True), "family.rope_layers": (True, False, True),
        "family.routing.bias_on_logits": True, "family.routing.bias": True,
        "family.norm_topk_prob": False, "family.shared_expert_intermediate_size": 48},
    "kolibri1_1": {
        "architecture": "kolibri1_1", "family.window_layers": (True, False, True, False),
        "family.rope_layers": (True, False, True, False),
        "family.moe_layers": (True, False, True, True), "family.kolibri11.kv_source": (0, 1, 2, 1),
        "family.kolibri11.budget": 7,
        "family.kolibri11.pool_layers": (False, True, False, False), "intermediate_size": 96,
        "num_kv_layers": 3},
    "axk1": {
        "architecture": "axk1", "family.moe_layers": (False, True, True),
        "family.routing.topk_method": "noaux_tc", "family.routing.n_group": 2,
        "family.routing.bias_optional": True, "family.mla.q_lora_rank": 24,
        "family.mla.rope_interleave": True, "family.shared_expert_intermediate_size": 32},
    "granitemoe-shared": {
        "architecture": "granitemoe", "family.shared_expert_intermediate_size": 48,
        "family.moe_intermediate_size": 32, "family.residual_multiplier": 0.5},
    "beam": {
        "architecture": "beam", "family.qk_norm": True, "family.sliding_window": 11,
        "family.window_layers": (True, False, True, False),
        "family.rope_layers": (True, False, True, False),
        "family.moe_layers": (False, True, True, False), "family.routing.n_group": 2,
        "family.routing.routed_scaling_factor": 2.5, "family.final_logit_softcapping": 6.0,
        "family.shared_expert_intermediate_size": 0},
    "aria-text": {
        "architecture": "aria_text", "family.num_experts": 8, "family.num_experts_per_tok": 2,
        "family.moe_intermediate_size": 32, "family.shared_expert_intermediate_size": 64,
        "family.routing.scoring": "softmax", "family.norm_topk_prob": True,
        "tie_word_embeddings": False},
}  # fmt: skip
# `server/weights.py` against the built model, bf16 from float32 files (rank 0's share of tp):
# float32 routers and correction biases (ERNIE's [1, E], MiniMax-M2's under `block_sparse_moe`,
# Hunyuan's `gate.wg`), shared experts and MLPs, dense layers, q/k norms (whole or per head),
# PhiMoE's LayerNorm and LM head biases
ESTIMATES = [("ernie45-moe", 1), ("ernie45-moe", 2), ("hunyuan-moe", 1), ("hunyuan-moe", 2),
             ("hunyuan-dense", 2), ("dots1", 1), ("dots1", 2), ("minimax-m2", 1),
             ("minimax-m2", 2), ("phimoe", 1), ("phimoe", 2), ("exaone-moe", 1),
             ("exaone-moe", 2), ("flex-olmo-norm", 1), ("flex-olmo-norm", 2), ("afmoe", 1),
             ("afmoe", 2), ("granitemoe-shared", 1), ("granitemoe-shared", 2),
             ("granitemoe-swa", 1), ("granitemoe-swa", 2), ("kolibri1", 1), ("kolibri1", 2), ("kolibri1_1", 1),
             ("kolibri1_1", 2),
             ("axk1", 1), ("axk1", 2),
             ("dbrx", 1), ("dbrx", 2), ("solar-open", 2),
             ("cohere2-moe", 1), ("cohere2-moe", 2), ("cohere2-moe-rms", 2),
             ("hy-v3", 1), ("hy-v3", 2), ("minicpm5-moe", 2), ("mellum", 2), ("jetmoe", 1),
             ("jetmoe", 2), ("jetmoe-top3", 1), ("aria-text", 1), ("aria-text", 2)]  # fmt: skip
# `from_shapes` (config.json alone) against the count from the tensors, exact: AfMoE's
# attention output gate (in FP8 with the projections), four norms a layer and per-head q/k
# norms; MiniMax-M2's q/k norms over all heads (whole on every rank); PhiMoE's q/k/v biases
# (by the rank's heads), o's and the LM head's (whole). Each was left out once.
FROM_SHAPES = {
    "afmoe": 1e-6,
    "minimax-m2": 1e-6,
    "phimoe": 1e-6,
    "granitemoe-shared": 1e-6,
    "granitemoe-swa": 1e-6,
    "kolibri1": 1e-6,
    "kolibri1_1": 1e-6,
    "axk1": 1e-6,
    "dbrx": 1e-6,
    "cohere2-moe": 1e-6,
    "cohere2-moe-rms": 1e-6,
    "minicpm5-moe": 1e-6,
    "flint": 1e-6,
    "beam": 1e-6,
    "aria-text": 1e-6,
}
# a tensor a checkpoint may not lack: refused at config time, one line naming it
MISSING = [
    ("ernie45-moe", "model.layers.1.mlp.moe_statics.e_score_correction_bias"),
    ("hunyuan-moe", "model.layers.0.self_attn.key_layernorm.weight"),
    ("hunyuan-moe", "model.layers.1.mlp.gate.wg.weight"),
    ("hunyuan-moe", "model.layers.1.mlp.shared_mlp.up_proj.weight"),
    ("minimax-m2", "model.layers.2.block_sparse_moe.e_score_correction_bias"),
    ("minimax-m2", "model.layers.0.block_sparse_moe.experts.3.w3.weight"),
    ("minimax-m2", "model.layers.1.self_attn.k_norm.weight"),
    ("afmoe", "model.layers.1.self_attn.gate_proj.weight"),
    ("afmoe", "model.layers.2.mlp.expert_bias"),
    ("afmoe", "model.layers.3.post_mlp_layernorm.weight"),
    ("afmoe", "model.layers.1.mlp.router.gate.weight"),
    ("granitemoe-shared", "model.layers.1.shared_mlp.output_linear.weight"),
    ("granitemoe-swa", "model.layers.2.self_attn.sinks"),
    ("kolibri1", "model.layers.1.moe.router.expert_bias"),
    ("kolibri1", "model.layers.2.post_ffn_norm.weight"),
    ("kolibri1_1", "model.layers.1.self_attn.k_norm.weight"),
    ("axk1", "model.layers.1.post_mlp_layernorm.weight"),
    ("dbrx", "transformer.blocks.1.ffn.experts.mlp.v1"),
    ("dbrx", "transformer.blocks.0.norm_attn_norm.attn.Wqkv.weight"),
    ("minicpm5-moe", "model.layers.0.self_attn.q_proj.weight"),
    ("mellum", "model.layers.1.mlp.up_proj.weight"),
    ("flint", "model.layers.0.self_attn.softmax_offset"),
    ("flint", "model.layers.2.mlp.shared_expert.down_proj.weight"),
    ("mellum", "model.layers.2.self_attn.k_norm.weight"),
    ("minicpm5-moe", "model.layers.2.mlp.gate.e_score_correction_bias"),
    ("hy-v3", "model.layers.1.mlp.expert_bias"),
    ("hy-v3", "model.layers.2.mlp.shared_mlp.down_proj.weight"),
    ("hy-v3", "model.layers.1.mlp.router.gate.weight"),
    ("jetmoe", "model.layers.1.self_attention.experts.input_linear.weight"),
    ("jetmoe", "model.layers.0.self_attention.kv_proj.weight"),
    ("jetmoe", "model.layers.1.mlp.bias"),
    ("jetmoe-top3", "model.layers.2.self_attention.experts.router.layer.weight"),
    ("beam", "model.layers.1.self_attn.gate_bias"),
    ("beam", "model.layers.3.pre_feedforward_layernorm.weight"),
    ("beam", "model.layers.2.mlp.gate.e_score_correction_bias"),
    ("aria-text", "model.layers.1.mlp.experts.fc1.weight"),  # (as transformers saves it)
    ("aria-text", "model.layers.2.mlp.shared_experts.down_proj.weight"),
    ("aria-text", "model.layers.0.mlp.router.weight"),
]
# Two ranks, one case per layout the families' own code splits: AfMoE's output gate split by
# heads, DBRX's stacked experts listed per expert, Cohere 2 MoE's shared experts averaged (the
# average halved before the sum); each with the routed experts by width and the router whole on
# each rank. The others split as a layout tested on two ranks elsewhere: ERNIE 4.5 MoE's,
# Hunyuan's, dots1's, EXAONE MoE's, Solar Open's and Hy3's heads (Qwen3's per-head q/k norms or
# none) beside experts and shared experts by width (GLM-4.5's, test_glm4_moe.py: dots1, EXAONE
# MoE, Solar Open and Hy3 run its model; Qwen2-MoE's and Mixtral's, test_tensor_parallel.py);
# MiniMax-M2's and FlexOlmo's q/k norms over the whole projections, all-reduced (OLMo 2's layer:
# test_tensor_parallel.py's olmo2-kv1, test_olmo_hybrid.py); PhiMoE's LayerNorm biases, q/k/v
# biases by heads and LM head bias after the gather (Phi's, test_dense_archs.py);
# GraniteMoeShared's shared MLP (Granite 4.0's, test_tp_hybrid.py). Their weights estimates are
# checked at tp 2 (ESTIMATES). A.X-K1: DeepSeek-V3's latent attention by heads, each MoE
# block's output norm after the ranks' sum; Kolibri 1: GLM-4's norms after attention and the
# MLP, per-head q/k norms and NoPE full layers beside window layers, GLM-4.5's experts;
# Kolibri 1.1: its KV-shared layers on their source's heads, the indexed layers' keys (pool
# and selection) picked by rank 0 and broadcast.
TWO_RANKS = ["afmoe", "dbrx", "cohere2-moe", "axk1", "kolibri1", "kolibri1_1", "jetmoe",
             "granitemoe-swa"]  # fmt: skip
# the layer whose experts the gpu test finds in the fused-MoE kernel (None: not checked)
MOE_LAYER = {"ernie45-moe": -2, "ernie45-moe-interval": -2, "hunyuan-moe": None,
             "hunyuan-moe-lists": None, "hunyuan-dense": None}  # fmt: skip


def write_case(name: str, path):
    """Case `name`'s checkpoint written to `path` by transformers (float32, eval), with its
    tensors drawn at random; returns the model."""
    arch, overrides, drawn = CASES[name]
    model = make_tiny_model(path, arch, **overrides)
    if drawn:
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for layer in model.model.layers:
                for attr, scale in drawn:
                    t = _attribute(layer, attr)
                    if t is not None:
                        t.copy_(torch.randn(t.shape, generator=g) * scale)
        model.save_pretrained(path)
    return model


def _attribute(obj, dotted: str):
    """`obj.a.b` for "a.b" (a dict's item where `obj.a` is a dict); None where one is missing."""
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _without(path, tensor: str, dest):
    """The checkpoint at `path` without `tensor`, its config.json beside it, written to `dest`."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    del tensors[tensor]
    (dest / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})


built = built_fixture(write_case)
case = case_fixture(CASES)


test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


@pytest.mark.parametrize("name", list(FIELDS))
def test_config_fields(built, name):
    c = read_model_config(str(built(name)[0]))
    assert {k: _attribute(c, k) for k in FIELDS[name]} == FIELDS[name]


@pytest.mark.parametrize(("name", "tp"), ESTIMATES)
def test_the_weights_estimate_is_what_the_model_holds(built, name, tp):
    from model_bytes import check_estimate

    check_estimate(built(name)[0], tp)


@pytest.mark.parametrize("name", list(FROM_SHAPES))
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fp8", [False, True])
def test_the_weights_from_shapes_as_from_its_tensors(built, name, tp, fp8):
    """`fit`'s count from config.json alone (`from_shapes`) against the headers' on a GPU."""
    from pagoda.runtime.quantization.fp8 import ONLINE_SCHEME
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, _, _ = built(name)
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    place = Placement(torch.bfloat16, "cuda", tp, ONLINE_SCHEME if fp8 else None)
    got, _ = weights.resident(ckpt, mc, place)
    want = weights.from_shapes(mc, torch.bfloat16, fp8, tp)
    assert got == pytest.approx(want, rel=FROM_SHAPES[name])


@pytest.mark.parametrize(("name", "tp"), [("jetmoe", 1), ("jetmoe", 2), ("jetmoe-top3", 1)])
def test_jetmoe_weights_from_shapes_as_from_its_tensors(built, name, tp):
    """JetMoE's `from_shapes` (16 bits: FP8 is refused) against the headers' on a GPU: every
    attention expert's q and o, the shared k/v (rank 0's KV heads of two), both routers and
    output biases."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path, _, _, _ = built(name)
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
    assert got == weights.from_shapes(mc, torch.bfloat16, False, tp)


@pytest.mark.parametrize(("name", "tensor"), MISSING)
def test_a_checkpoint_without_one_of_its_tensors_is_refused_at_config_time(
    built, tmp_path, name, tensor
):
    _without(built(name)[0], tensor, tmp_path)
    with pytest.raises(ValueError, match=f"missing tensor '{tensor}'"):
        read_model_config(str(tmp_path))


@pytest.mark.slow  # a second process (gloo): ~10 s on 2 busy cores
@pytest.mark.parametrize("name", TWO_RANKS)
def test_two_tensor_parallel_ranks_match_transformers(built, name):
    path, _, loaded, reference = built(name)
    check_two_ranks(path, loaded, reference, name, kv_heads=1)


def test_kolibri1_1_ranks_leaving_rank_0_fewer_heads_than_its_selection_reads_are_refused(built):
    """Rank 0 selects the indexed layers' keys by the first `index_num_heads` (2 of 4) query
    heads: two ranks split the model, four leave rank 0 one head, refused in one line."""
    from pagoda.runtime.distributed.layout import check

    mc = read_model_config(str(built("kolibri1_1")[0]))
    check(mc, 2)
    with pytest.raises(ValueError, match=r"leaves rank 0 1 query heads, fewer than Kolibri "
                       r"1\.1's index_num_heads \(2\)"):  # fmt: skip
        check(mc, 4)


def _fused_moe(name, runner):
    layer = MOE_LAYER.get(name, -1)
    if layer is not None:
        fused_moe_at(layer)(name, runner)


# On CUDA: the experts in the fused-MoE kernel, decodes in CUDA graphs, no host sync
test_gpu_matches_transformers_with_graphs = gpu_test(_fused_moe)


# ERNIE 4.5 MoE


def test_ernie_moe_layers_as_transformers_and_its_bias_as_stored(built):
    """The expert layers where transformers puts them; the correction bias stored [1, E]
    (without it the engine would pick other experts: the case tests it)."""
    from safetensors import safe_open

    path, model, _, _ = built("ernie45-moe-interval")
    f = read_model_config(str(path)).family
    assert f.moe_layers == tuple(hasattr(x.mlp, "gate") for x in model.model.layers)
    path = built("ernie45-moe")[0]
    with safe_open(str(path / "model.safetensors"), "pt") as st:
        bias = st.get_slice("model.layers.1.mlp.moe_statics.e_score_correction_bias")
        assert bias.get_shape() == [1, 8]


# Hunyuan


def test_hunyuan_alpha_rotary_is_transformers_ntk_alpha(built):
    """The rotary FIELDS reads as a larger base is the one transformers runs as NTK-alpha."""
    assert built("hunyuan-moe")[1].model.rotary_emb.rope_type == "ntk_alpha"


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [("moe_topk", [2, 3], "moe_topk"), ("moe_intermediate_size", [16, 16], "(48)"),
     ("num_shared_expert", 2, "num_shared_expert"), ("use_cla", True, "cross-layer")],
)  # fmt: skip
def test_what_hunyuan_in_transformers_would_run_otherwise_is_refused(
    built, tmp_path, key, value, match
):
    path, _, _, _ = built("hunyuan-moe")
    cfg = json.loads((path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    with pytest.raises(ValueError, match=match):
        read_model_config(str(tmp_path))


# dots.llm1


def test_dots1_window_without_layer_types_reads_as_transformers(built, tmp_path):
    """The window on transformers' layer_types (FIELDS), and a config without layer_types (the
    released ones: `sliding_window` null, or set with `max_window_layers`) read as Dots1Config
    does."""
    cfg = json.loads((built("dots1")[0] / "config.json").read_text())
    del cfg["layer_types"]
    for window, layers in ((None, 1), (7, 2), (7, 5)):
        cfg.update(sliding_window=window, max_window_layers=layers)
        (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone
        theirs = transformers.AutoConfig.from_pretrained(tmp_path).layer_types
        ours = read_model_config(str(tmp_path)).family
        want = tuple(t == "sliding_attention" for t in theirs)
        assert tuple(ours.window(i) is not None for i in range(3)) == want
        assert ours.sliding_window == (window if any(want) else None)


# MiniMax-M2


def test_minimax_m2_rotary_dim_reads_as_transformers(built, tmp_path):
    """A released config's `rotary_dim` beside a top-level rope_theta, no rope_parameters: the
    same partial rotary as transformers'."""
    cfg = json.loads((built("minimax-m2")[0] / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=5e6, rotary_dim=8)
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.rope_scaling["partial_rotary_factor"] == theirs["partial_rotary_factor"] == 0.25
    assert ours.rope_theta == theirs["rope_theta"] == 5e6


def test_minimax_m2_block_wise_fp8_checkpoint_as_minimax_publishes_it(built, tmp_path):
    """MiniMax-M2's release format: attention's projections and every expert's w1/w2/w3 in
    E4M3 with a float32 `weight_scale_inv` per tile, the router, its bias, the norms, the
    embedding and the head in 16 bits, its quantization_config naming the format
    `float8_e4m3fn` and the modules left out: it loads dequantized and gives transformers'
    tokens and logits on its dequantized weights."""
    from arch_cases import NEW, check, generate, prompts
    from fp8_testlib import write_blocks_of
    from hf_oracle import hf_greedy_plain
    from pagoda.runtime import LLM
    from pagoda.runtime.model.loader import load_model

    qc = {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
          "weight_block_size": [16, 16],
          "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}  # fmt: skip
    experts = ("proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")
    write_blocks_of(built("minimax-m2")[0], tmp_path, qc, (16, 16), lambda n: n.endswith(experts))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized").eval()
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    loaded = load_model(str(tmp_path / "fp8"))
    assert loaded.fp8_scheme.block == (16, 16)
    llm = LLM(loaded=loaded, dtype="float32", kv_cache_memory=16 << 20,
              max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    for i, (got, want) in enumerate(zip(generate(llm, prompts()), reference)):
        check(got, want, f"FP8 MiniMax-M2: prompt {i}")


# PhiMoE


def test_phimoe_long_tables_attention_factor(built):
    """The long table (sequences past the original context) rotates with the long factors as
    transformers' longrope computes them, times `long_mscale`."""
    from pagoda.runtime.model.ops import build_cos_sin_cache
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path, model, _, _ = built("phimoe")
    c = read_model_config(str(path))
    table = build_cos_sin_cache(c.head_dim, c.rope_theta, c.rope_scaling, 300)
    inv, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, "cpu", seq_len=200)
    freqs = torch.outer(torch.arange(300, dtype=torch.float32), inv)
    want = torch.cat([freqs.cos() * 1.4, freqs.sin() * 1.4], dim=-1)
    assert torch.allclose(table[300:], want, atol=1e-6)


def test_phimoe_sparsemixer_picks_as_transformers():
    """Two experts a token, each weighted by a softmax over the logits near it, ties and a
    wide eps included."""
    from pagoda.runtime.model.moe_routing import sparsemixer
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as theirs

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8, generator=g)
    logits[0] = 1.0  # a tie
    for eps in (0.0, 0.01, 0.3, 2.0):
        weights, ids = sparsemixer(logits, eps)
        want_weights, want_ids = theirs(logits, eps, training=False)
        assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


# EXAONE MoE


def test_exaone_moe_pattern_string_beside_layer_types_reads_as_transformers(built, tmp_path):
    """EXAONE's own configs name the pattern "LLLG" beside `layer_types`: transformers reads
    the list (and never the string); so does the engine (it raised a TypeError)."""
    cfg = json.loads((built("exaone-moe-types")[0] / "config.json").read_text())
    cfg["sliding_window_pattern"] = "LLLG"
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).layer_types
    f = read_model_config(str(tmp_path)).family
    assert f.window_layers == tuple(t == "sliding_attention" for t in theirs) == (
        False, True, False)  # fmt: skip


# DBRX


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [("moe_normalize_expert_weights", 2.0, "moe_normalize_expert_weights"),
     ("ffn_act_fn", {"name": "gelu"}, "ffn_act_fn")],
)  # fmt: skip
def test_what_dbrx_would_run_otherwise_is_refused(built, tmp_path, key, value, match):
    cfg = json.loads((built("dbrx")[0] / "config.json").read_text())
    cfg["ffn_config"][key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        read_model_config(str(tmp_path))


# Cohere 2 MoE


def test_cohere2_moe_config_without_layer_kinds_reads_as_transformers(built, tmp_path):
    """A config.json without `layer_types` / `mlp_layer_types` (`first_k_dense_replace` and
    the two window patterns instead): the layers' kinds as Cohere2MoeConfig derives them."""
    cfg = json.loads((built("cohere2-moe")[0] / "config.json").read_text())
    del cfg["layer_types"], cfg["mlp_layer_types"]
    for dense, prefix in ((1, 1), (2, 2), (0, 1)):
        cfg.update(first_k_dense_replace=dense, prefix_dense_sliding_window_pattern=prefix)
        (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone
        theirs = transformers.AutoConfig.from_pretrained(tmp_path)
        f = read_model_config(str(tmp_path)).family
        sliding = tuple(t == "sliding_attention" for t in theirs.layer_types)
        assert tuple(f.window(i) is not None for i in range(4)) == sliding
        assert f.moe_layers == tuple(m == "sparse" for m in theirs.mlp_layer_types)
        force = [m == "dense" and prefix == 1 for m in theirs.mlp_layer_types]
        assert f.rope_layers == tuple(s or r for s, r in zip(sliding, force))


# JetMoE


def test_jetmoe_fp8_is_refused_in_one_line(built):
    """--quantization fp8 (`start_checks.check_dtype`): refused in one line, not served untested (the
    routed attention is not run in the FP8 GEMM)."""
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.engine.start_checks import check_dtype

    path, _, loaded, _ = built("jetmoe")
    cfg = EngineConfig.create(str(path), device="cpu")
    check_dtype(cfg, loaded.config)
    fp8 = SimpleNamespace(quantization="fp8", torch_dtype=cfg.torch_dtype)  # (a CPU has no FP8)
    with pytest.raises(ValueError, match=r"^--quantization fp8 is not supported for a jetmoe "):
        check_dtype(fp8, loaded.config)


def test_jetmoe_config_reads_the_published_keys(built, tmp_path):
    """jetmoe/jetmoe-8b's config.json keys (`kv_channels`, `activation_function`, no
    `num_attention_heads`: KV heads x top-k, as JetMoeConfig derives them) read as transformers
    reads them; an activation other than silu refused."""
    path, _, _, _ = built("jetmoe-top3")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["num_attention_heads"]
    cfg["activation_function"] = "silu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    c = read_model_config(str(tmp_path))
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (3, 1, 32)
    cfg["activation_function"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gelu"):
        read_model_config(str(tmp_path))


def test_jetmoe_that_does_not_fit_is_offered_more_ranks_not_fp8_weights(built, monkeypatch):
    """`fit`'s fixes for a JetMoE that does not fit never name what is refused at start
    (`--quantization fp8`); an FP8 KV cache and two ranks (its KV heads split) are offered."""
    from pagoda.runtime import config
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import fit, memory
    from pagoda.runtime.termination import ReasonedError

    path = built("jetmoe")[0]
    mc = read_model_config(str(path))
    cfg = EngineConfig.create(str(path), device="cuda", dtype="bfloat16", max_model_len=512)
    need = fit.Plan(torch.bfloat16, False, False, max_model_len=512).need(mc)
    # usable (x 0.9, less 1 GiB of headroom): short of bf16 weights and KV, an FP8 KV cache fits
    total = int(((1 << 30) + need * 0.9) / 0.9)
    monkeypatch.setattr(memory, "device_available", lambda d: (total, total))
    for module in (fit, config):
        monkeypatch.setattr(module, "fp8_runs_on", lambda d: d.type == "cuda")
    with pytest.raises(ReasonedError) as err:
        fit.check(mc, cfg, path)
    text = str(err.value)
    fixes = text.split("; would fit: ")[1]
    assert fixes.startswith("--kv-cache-dtype fp8 (") and "--quantization" not in fixes, text
    assert "--tensor-parallel-size 2 (" in fixes, text


def test_axk1_without_correction_biases_routes_as_transformers(built, tmp_path):
    """A.X-K1's releases hold no `e_score_correction_bias` (transformers leaves it at its
    zero init) and a `post_mlp_layernorm` in the dense layers too (which transformers
    ignores): such a checkpoint is read (not refused), routes as transformers does with zero
    biases, and the weights estimate counts what the model holds (not the dense layers'
    norms)."""
    from arch_cases import NEW, generate, prompts
    from hf_oracle import hf_greedy_plain, save_word_tokenizer
    from model_bytes import check_estimate
    from pagoda.runtime import LLM
    from safetensors.torch import load_file, save_file

    path, model, _, _ = built("axk1")
    tensors = load_file(str(path / "model.safetensors"))
    kept = {k: v for k, v in tensors.items() if not k.endswith("e_score_correction_bias")}
    assert len(kept) == len(tensors) - 2
    kept["model.layers.0.post_mlp_layernorm.weight"] = torch.full((64,), 5.0)  # (not read)
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(kept, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    save_word_tokenizer(tmp_path, 300)
    prompt = prompts()[0]  # (53 tokens: four 16-token chunks)
    biases = [layer.mlp.gate.e_score_correction_bias for layer in model.model.layers[1:]]
    saved = [b.clone() for b in biases]
    try:  # transformers' model as it loads without them: zero biases
        for b in biases:
            b.zero_()
        want = hf_greedy_plain(model, prompt, NEW)[0]
    finally:
        for b, v in zip(biases, saved):
            b.copy_(v)
    llm = LLM(str(tmp_path), dtype="float32", max_num_batched_tokens=16, max_num_seqs=4,
              kv_cache_memory=4 << 20)  # fmt: skip
    assert generate(llm, [prompt])[0][0] == want
    check_estimate(tmp_path, 1)
