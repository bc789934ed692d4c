"""The MoE families' published config.json files (shrunk, or naming the shape alone: the rest
from transformers' config defaults) read as transformers reads them, with no checkpoint: the
rotary, windows, dense and expert layers, routers and ids, and where the family's own code
counts them transformers' parameter count on the meta device; what transformers would run
otherwise refused in one line. The families' checkpoints against transformers:
test_moe_families.py."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import FULL, SLIDING
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")


# PhiMoE


def test_phimoe_released_config_format_reads_as_transformers(tmp_path):
    """Phi-3.5-MoE-instruct's config.json (shrunk): `PhiMoEForCausalLM`, a top-level
    rope_theta, `rope_scaling` of type longrope with its mscales, a window as long as the
    context, both biases: read as transformers 5 reads it."""
    cfg = dict(architectures=["PhiMoEForCausalLM"], model_type="phimoe", hidden_size=64,
               intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
               max_position_embeddings=131072, original_max_position_embeddings=4096,
               rope_theta=10000.0, sliding_window=131072, attention_bias=True,
               lm_head_bias=True, router_jitter_noise=0.01, input_jitter_noise=0.01,
               rms_norm_eps=1e-05, vocab_size=300, rope_scaling={
                   "type": "longrope", "long_mscale": 1.243163121016122,
                   "short_mscale": 1.243163121016122, "original_max_position_embeddings": 4096,
                   "long_factor": [1.0 + i for i in range(8)], "short_factor": [1.0] * 8})  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path).rope_parameters
    ours = read_model_config(str(tmp_path))
    assert ours.architecture == "phimoe" and ours.attention_bias
    assert ours.rope_theta == theirs["rope_theta"] == 10000.0
    scaling = ours.rope_scaling
    assert scaling["type"] == theirs["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 4096
    assert (scaling["short_mscale"], scaling["long_mscale"]) == (
        theirs["short_mscale"], theirs["long_mscale"])  # fmt: skip
    assert ours.family.sliding_window == 131072 and ours.family.routing.jitter_eps == 0.01


# DBRX


def test_dbrx_released_config_reads_as_the_model_was_trained(tmp_path):
    """dbrx-instruct's config.json (shrunk): MPT's top-level names, the KV heads, clamp and base
    in `attn_config`, the experts in `ffn_config` (`moe_jitter_eps` a training setting); the
    base `attn_config.rope_theta` (500,000), as DBRX's own code and vLLM read it: transformers
    5.25 reads 10,000 (its DbrxConfig has no place for the nested one)."""
    cfg = dict(architectures=["DbrxForCausalLM"], model_type="dbrx", d_model=64, n_heads=4,
               n_layers=2, max_seq_len=32768, vocab_size=300, tie_word_embeddings=False,
               attn_config={"clip_qkv": 8, "kv_n_heads": 2, "rope_theta": 500000},
               ffn_config={"ffn_hidden_size": 32, "moe_jitter_eps": 0.01,
                           "moe_loss_weight": 0.05, "moe_num_experts": 4, "moe_top_k": 2})  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.num_layers) == (
        theirs.hidden_size, theirs.num_attention_heads, theirs.num_key_value_heads, 2)  # fmt: skip
    assert c.max_position_embeddings == theirs.max_position_embeddings == 32768
    assert c.rope_theta == 500000.0 and theirs.rope_parameters["rope_theta"] == 10000.0
    f = c.family
    assert (f.clip_qkv, f.num_experts, f.num_experts_per_tok, f.moe_intermediate_size) == (
        8.0, 4, 2, 32)  # fmt: skip
    assert f.norm_topk_prob and c.rms_norm_eps == 1e-5 and not c.tie_word_embeddings


# Solar Open


def test_solar_open_sparse_config_reads_as_transformers(tmp_path):
    """A config.json naming only the shape (Solar-Open-100B's, shrunk): the rest from
    SolarOpenConfig's defaults (base 1e6, head_dim 128, one shared expert, renormalised, one
    group), the experts' width as the model's width (it has no dense MLP)."""
    cfg = dict(architectures=["SolarOpenForCausalLM"], model_type="solar_open", hidden_size=64,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               vocab_size=300)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert c.rope_theta == theirs.rope_parameters["rope_theta"] == 1e6
    assert c.head_dim == theirs.head_dim == 128 and c.rope_scaling is None
    f = c.family
    assert f.shared_expert_intermediate_size == 32 * theirs.n_shared_experts
    assert f.norm_topk_prob == theirs.norm_topk_prob and f.routing.n_group == theirs.n_group
    assert f.moe_layers == (True, True) and c.intermediate_size == 32


# MiniCPM5-MoE


def test_minicpm5_moe_published_config_reads_as_transformers(tmp_path):
    """MiniCPM5-15B-A2.5B's config.json under its older architecture name (the defaults are its
    shape), with the older `first_k_dense_replace` in place of `mlp_layer_types`: base 5e6, the
    dense layers, the ids and transformers' parameter count on the meta device (the gate rows
    of q_proj counted); the attention without its gate refused in one line."""
    cfg = dict(architectures=["MiniCPM5MoEForCausalLM"], model_type="minicpm5_moe",
               first_k_dense_replace=2)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert c.architecture == "minicpm5_moe" and c.rope_scaling is None
    assert c.rope_theta == theirs.rope_parameters["rope_theta"] == 5e6
    assert c.family.moe_layers == tuple(m == "sparse" for m in theirs.mlp_layer_types)
    assert c.family.moe_layers[:3] == (False, False, True)
    assert (c.bos_token_id, list(c.eos_token_ids)) == (theirs.bos_token_id, theirs.eos_token_id)
    with torch.device("meta"):
        hf = transformers.MiniCPM5MoeForCausalLM(theirs)
    assert c.num_params == sum(p.numel() for p in hf.parameters()) == 14_546_094_080
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "use_gated_attention": False}))
    with pytest.raises(ValueError, match="use_gated_attention false is not supported"):
        read_model_config(str(tmp_path))


# Mellum


def test_mellum_published_config_reads_as_transformers(tmp_path):
    """Mellum2-12B-A2.5B's config.json (transformers' MellumConfig defaults are its shape) with
    its sliding layers named: the rotary by kind, the window, the experts in every layer (the
    hub's `num_experts` key), transformers' parameter count on the meta device; a partial
    rotary (which transformers' Mellum cannot run) refused in one line, on either kind."""
    types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 7
    cfg = dict(architectures=["MellumForCausalLM"], model_type="mellum", layer_types=types,
               num_experts=64)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert c.rope_theta == theirs.rope_parameters[FULL]["rope_theta"] == 5e5
    assert c.family.local_rope_theta == theirs.rope_parameters[SLIDING]["rope_theta"]
    assert c.family.sliding_window == theirs.sliding_window == 1024
    assert [c.family.window(i) is not None for i in range(28)] == [t == SLIDING for t in types]
    assert c.family.moe_layers == (True,) * 28 and c.family.num_experts == 64
    with torch.device("meta"):
        hf = transformers.MellumForCausalLM(theirs)
    assert c.num_params == sum(p.numel() for p in hf.parameters())  # (q/k norms counted)
    half = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    for kind, words in ((SLIDING, "sliding_attention rotary"), (FULL, "a partial rotary")):
        rope = {**theirs.rope_parameters, kind: half}
        (tmp_path / "config.json").write_text(json.dumps({**cfg, "rope_parameters": rope}))
        with pytest.raises(ValueError, match=words):
            read_model_config(str(tmp_path))


# Flint


def test_flint_published_config_reads_as_transformers(tmp_path):
    """Flint's config.json (transformers' FlintConfig defaults are its shape): the layer kinds
    and dense layers as FlintConfig derives them, rotary on the sliding layers only,
    transformers' parameter count on the meta device; biases on attention refused in one
    line."""
    cfg = dict(architectures=["FlintForCausalLM"], model_type="flint")
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    sliding = tuple(t == SLIDING for t in theirs.layer_types)
    assert c.family.window_layers == c.family.rope_layers == sliding and sum(sliding) == 35
    assert c.family.sliding_window == theirs.sliding_window == 513
    assert c.family.moe_layers == tuple(i not in theirs.mlp_only_layers for i in range(49))
    with torch.device("meta"):
        hf = transformers.FlintForCausalLM(theirs)
    assert c.num_params == sum(p.numel() for p in hf.parameters())  # (q/k norms, sinks too)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "attention_bias": True}))
    with pytest.raises(ValueError, match="flint attention_bias"):
        read_model_config(str(tmp_path))


# Hy3


def test_hy_v3_sparse_config_reads_as_transformers(tmp_path):
    """A config.json naming the shape alone: HYV3Config's base (11,158,840), its dense first
    layer and its router scale, as transformers reads them."""
    cfg = dict(architectures=["HYV3ForCausalLM"], model_type="hy_v3", hidden_size=64,
               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               num_experts=8, moe_intermediate_size=32, vocab_size=300)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    assert c.rope_theta == theirs.rope_parameters["rope_theta"] == 11_158_840.0
    f = c.family
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert f.routing.routed_scaling_factor == theirs.router_scaling_factor
    assert f.num_experts_per_tok == theirs.num_experts_per_tok == 8


# Beam


def test_beam_sparse_config_reads_as_transformers(tmp_path):
    """Beam-1.0's shape from BeamConfig's defaults (7 layers, 16 experts: a quick count): every
    sixth and the last full attention without rotary, the first three dense, 8 groups of which
    4, the cap 30, the sliding layers' base from `rope_parameters`; transformers' parameter
    count (meta device)."""
    cfg = {"architectures": ["BeamForCausalLM"], "model_type": "beam", "num_hidden_layers": 7,
           "num_experts": 16,
           "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 50000.0},
                               "full_attention": None}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # a config alone: no weights read
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    c = read_model_config(str(tmp_path))
    f = c.family
    sliding = tuple(t == SLIDING for t in theirs.layer_types)
    assert f.window_layers == f.rope_layers == sliding and sliding[4:] == (True, False, False)
    assert f.sliding_window == theirs.sliding_window == 512 and c.rope_theta == 50000.0
    assert f.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    assert (f.routing.n_group, f.routing.topk_group, f.final_logit_softcapping) == (8, 4, 30.0)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size) == (48, 8, 128, 5120)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(theirs)
    assert c.num_params == sum(p.numel() for p in hf.parameters())
