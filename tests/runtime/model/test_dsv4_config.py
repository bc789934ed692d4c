"""DeepSeek-V4's config.json and checkpoint names (`dsv4_config`) against transformers: the
fields transformers' ``DeepseekV4Config`` derives (defaults, legacy keys of the published
configs), and the tensors ``DeepseekV4ForCausalLM.save_pretrained`` writes, in its names and in
the published ones, each read as transformers' module names with their shapes; a missing or
misshapen tensor refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from pagoda.runtime.model import dsv4_config as D

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

TINY = dict(
    hidden_size=32, head_dim=16, partial_rotary_factor=0.5, num_hidden_layers=3,
    num_attention_heads=4, q_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=2,
    layer_types=[D.SLIDING, D.CSA, D.HCA], mlp_layer_types=["hash_moe", "moe", "moe"],
    sliding_window=6, o_groups=2, o_lora_rank=8, compress_rates={D.CSA: 4, D.HCA: 8},
    vocab_size=64, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, hc_mult=3,
)  # fmt: skip


def _ours_vs_theirs(ours: D.Dsv4Config, theirs) -> None:
    assert list(ours.layer_types) == theirs.layer_types
    assert list(ours.mlp_layer_types) == theirs.mlp_layer_types
    want_rates = [0 if k == D.SLIDING else theirs.compress_rates[k] for k in theirs.layer_types]
    assert list(ours.compress_rates) == want_rates
    assert ours.rope_dim == theirs.qk_rope_head_dim
    for rot, key in ((ours.main_rope, "main"), (ours.compress_rope, "compress")):
        p = theirs.rope_parameters[key]
        assert (rot.theta, rot.rope_type) == (p["rope_theta"], p["rope_type"])
        if rot.rope_type == "yarn":
            assert rot.factor == p["factor"]
            assert rot.original_max_position_embeddings == p["original_max_position_embeddings"]
            assert rot.attention_factor == p["attention_factor"]
    hc = ours.hyper
    assert (hc.mult, hc.sinkhorn_iters, hc.eps) == (theirs.hc_mult, theirs.hc_sinkhorn_iters,
                                                    theirs.hc_eps)  # fmt: skip
    for a, b in (("o_groups", "o_groups"), ("o_lora_rank", "o_lora_rank"),
                 ("index_topk", "index_topk"), ("num_experts", "n_routed_experts"),
                 ("sliding_window", "sliding_window"), ("q_lora_rank", "q_lora_rank"),
                 ("moe_intermediate_size", "moe_intermediate_size"),
                 ("routed_scaling_factor", "routed_scaling_factor")):  # fmt: skip
        assert getattr(ours, a) == getattr(theirs, b), a


def test_published_style_config_reads_as_transformers():
    """The legacy keys a published config.json ships (per-layer compress_ratios, num_hash_layers,
    qk_rope_head_dim, top-level yarn rope_scaling, the compressed layers' base) and defaults."""
    cfg = {"num_hidden_layers": 6, "compress_ratios": [0, 0, 4, 128, 4, 128],
           "num_hash_layers": 2, "qk_rope_head_dim": 64, "head_dim": 512,
           "rope_theta": 10000, "compress_rope_theta": 160000,
           "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                            "beta_fast": 32, "beta_slow": 1},
           "hc_mult": 4, "hc_sinkhorn_iters": 20, "o_groups": 8, "num_attention_heads": 64}  # fmt: skip
    ours = D.read(cfg)
    _ours_vs_theirs(ours, transformers.DeepseekV4Config(**cfg))
    assert ours.compress_rope.rope_type == "yarn" and ours.main_rope.rope_type == "default"
    assert ours.compress_rope.factor == 16 and ours.compress_rope.attention_factor == 1.0
    bare = {"num_hidden_layers": 5}  # V4-Pro's layer schedule, three hash layers
    _ours_vs_theirs(D.read(bare), transformers.DeepseekV4Config(**bare))
    # the released quantization (dsv4_quant.py): V4's top-level expert_dtype, V4.1's inside
    qc = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
          "activation_scheme": "dynamic", "weight_block_size": [128, 128]}  # fmt: skip
    for released in ({"quantization_config": qc, "expert_dtype": "fp4"},
                     {"quantization_config": {**qc, "expert_dtype": "fp4"}}):  # fmt: skip
        theirs = transformers.DeepseekV4Config(**bare, **released).quantization_config
        assert theirs["expert_dtype"] == "fp4"
        assert D.read({**bare, **released}).quant == D.dsv4_quant.Dsv4Quant((128, 128), True)
    assert D.read(bare).quant is None


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cfg = transformers.DeepseekV4Config(**TINY)
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(cfg)
    path = tmp_path_factory.mktemp("dsv4")
    model.save_pretrained(path)
    with safetensors.safe_open(str(path / "model.safetensors"), "pt") as f:
        headers = {k: ("BF16", list(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
    config = json.loads((path / "config.json").read_text())
    return config, headers, model.state_dict()


def test_saved_checkpoint_names_and_shapes(saved):
    config, headers, state = saved
    c = D.read(config)
    _ours_vs_theirs(c, transformers.DeepseekV4Config(**TINY))
    stored = D.check_headers(c, headers)
    assert set(stored.values()) == set(headers)  # every saved tensor is read
    assert set(stored) == set(D.expected_shapes(c))
    # the names are transformers' modules' (its routed experts stacked there, one by one here)
    experts = [k for k in stored if ".experts." in k and ".shared_" not in k]
    others = {k: tuple(state[k].shape) for k in stored if k not in experts}
    assert others == {k: D.expected_shapes(c)[k] for k in others}
    e, w, h = c.num_experts, c.moe_intermediate_size, c.hidden_size
    assert tuple(state["model.layers.1.mlp.experts.gate_up_proj"].shape) == (e, 2 * w, h)
    assert len(experts) == 3 * e * c.num_layers
    # the published names (no `model.` prefix, `embed.weight`) read alike
    published = {k.removeprefix("model.").replace("embed_tokens.", "embed."): v
                 for k, v in headers.items()}  # fmt: skip
    assert set(D.check_headers(c, published)) == set(stored)


def test_missing_or_misshapen_tensor_refused_in_one_line(saved):
    config, headers, _ = saved
    c = D.read(config)
    for gone in ("model.layers.1.attn.indexer.compressor.ape", "model.layers.0.ffn.gate.tid2eid",
                 "model.layers.2.ffn.experts.3.w2.weight", "model.hc_head.hc_fn"):  # fmt: skip
        with pytest.raises(ValueError, match="missing tensor") as err:
            D.check_headers(c, {k: v for k, v in headers.items() if k != gone})
        assert "\n" not in str(err.value)
    bad = dict(headers, **{"model.layers.2.attn.compressor.wkv.weight": ("BF16", [32, 32])})
    with pytest.raises(ValueError, match=r"compressor.wkv.weight is \[32, 32\]"):
        D.check_headers(c, bad)


@pytest.mark.parametrize(
    "change, match",
    [({"layer_types": [D.SLIDING, "full_attention", D.HCA]}, "layer_types"),
     ({"mlp_layer_types": ["moe", "moe"]}, "mlp_layer_types has 2 entries"),
     ({"o_groups": 3}, "o_groups 3"),
     ({"num_key_value_heads": 2}, "num_key_value_heads"),
     ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_type 'llama3'"),
     ({"quantization_config": {"quant_method": "mxfp4"}}, "quant_method 'mxfp4'"),
     ({"quantization_config": {"quant_method": "fp8", "scale_fmt": "e4m3"}}, "scale_fmt 'e4m3'"),
     ({"quantization_config": {"quant_method": "fp8"}, "expert_dtype": "fp6"}, "'fp6'")],
)  # fmt: skip
def test_refusals_are_one_line(change, match):
    with pytest.raises(ValueError, match=match) as err:
        D.read({**TINY, **change})
    assert "\n" not in str(err.value)


def test_rotary_tables_match_transformers():
    """Both tables of the published-style config (main: base 1e4; compress: base 1.6e5 with yarn
    x16 over 65536, attention factor 1) at positions far past the original context."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    cfg = {"num_hidden_layers": 2, "qk_rope_head_dim": 64, "head_dim": 512,
           "compress_rope_theta": 160000, "max_position_embeddings": 1048576,
           "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                            "original_max_position_embeddings": 65536}}  # fmt: skip
    c = D.read(cfg)
    theirs = DeepseekV4RotaryEmbedding(transformers.DeepseekV4Config(**cfg))
    pos = torch.tensor([[0, 1, 7, 4096, 70000, 1000000]])
    x = torch.zeros(1, dtype=torch.float32)
    for rot, table in ((c.main_rope, "main"), (c.compress_rope, "compress")):
        want = theirs(x, pos, layer_type=table)
        got = D.rotary(rot, c.rope_dim, pos)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_num_params_is_transformers_meta_count():
    """The published widths (transformers' defaults) on four layers (HCA, HCA, CSA, HCA; three
    hash-routed): transformers' parameters and persistent buffers on the meta device."""
    cfg = transformers.DeepseekV4Config(num_hidden_layers=4)
    with torch.device("meta"):
        model = transformers.DeepseekV4ForCausalLM(cfg)
    want = sum(p.numel() for p in model.parameters())
    want += sum(b.numel() for n, b in model.named_buffers() if "rotary_emb" not in n)
    assert D.num_params(D.read(cfg.to_dict())) == want
