"""MiMo-V2-Flash (`MiMoV2FlashForCausalLM`, model/mimo_v2_flash.py) against transformers 5's
modeling_mimo_v2_flash.py: a tiny checkpoint with both layer kinds (the sliding ones with twice
the KV heads and attention sinks), values narrower than the keys and scaled, a partial rotary
of another base by kind, a dense first layer then DeepSeek-V3-routed experts (correction biases
drawn so they change the picks). Greedy tokens and logits as transformers', in a batch of
unequal prompts over 16-token steps (chunked prefill), on a warm prefix cache and preempted;
the config read as transformers reads it, a missing sink refused, the weights estimate, and
two ranks (tensor parallelism) as transformers, FP8 refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from arch_cases import (
    NEW,
    check_chunked_cached_batched,
    check_preempted,
    check_two_ranks,
    prompts,
    scramble_correction_biases,
)
from hf_oracle import hf_greedy_plain, make_tiny_model
from pagoda.runtime import LLM
from pagoda.runtime.model.loader import load_model, read_model_config

transformers = pytest.importorskip("transformers")

CONFIG = dict(
    head_dim=24, v_head_dim=16, num_attention_heads=4, num_key_value_heads=1,
    n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_group=2, topk_group=1,
    routed_scaling_factor=1.5, num_hidden_layers=3, sliding_window=5, attention_value_scale=0.6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    tie_word_embeddings=False,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334},
    },
)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("mimo")
    model = make_tiny_model(path, "MiMoV2Flash", **CONFIG)
    scramble_correction_biases(model, path, 1)
    reference = [hf_greedy_plain(model, p, NEW) for p in prompts()]
    return path, model, load_model(str(path)), reference


def test_greedy_matches_transformers_chunked_cached_batched_and_preempted(built):
    _, _, loaded, reference = built
    check_chunked_cached_batched(loaded, reference, "mimo_v2_flash")
    check_preempted(loaded, reference, "mimo_v2_flash")


def test_config_reads_as_transformers(built):
    c = read_model_config(str(built[0]))
    m = c.family.mimo
    assert (c.architecture, c.head_dim, c.num_kv_heads) == ("mimo_v2_flash", 24, 1)
    assert (m.swa_kv_heads, m.v_head_dim, m.v_scale) == (2, 16, 0.6)
    assert c.kv_layer_shapes == ((2, 24), (1, 24), (2, 24))
    assert c.family.window_layers == (True, False, True) and c.family.sliding_window == 5
    assert c.family.moe_layers == (False, True, True)
    assert (c.rope_theta, c.family.local_rope_theta) == (5e6, 1e4)


def test_published_style_config_reads_as_transformers(tmp_path):
    """The shape alone: transformers' defaults (the first and every sixth layer full attention,
    a dense first layer, the published rotary bases, `sliding_window_size` + 1)."""
    cfg = dict(architectures=["MiMoV2FlashForCausalLM"], model_type="mimo_v2_flash",
               hidden_size=64, num_hidden_layers=7, vocab_size=300, sliding_window_size=128)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = read_model_config(str(tmp_path))
    want = transformers.MiMoV2FlashConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    assert c.family.window_layers == tuple(t == "sliding_attention" for t in want.layer_types)
    assert c.family.sliding_window == want.sliding_window == 129
    assert c.family.moe_layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert c.rope_theta == want.rope_parameters["full_attention"]["rope_theta"]
    assert c.family.local_rope_theta == want.rope_parameters["sliding_attention"]["rope_theta"]
    assert (c.head_dim, c.family.mimo.v_head_dim, c.family.mimo.v_scale) == (192, 128, 0.707)


def test_a_checkpoint_without_a_sink_is_refused(built, tmp_path):
    from safetensors.torch import load_file, save_file

    path = built[0]
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.0.self_attn.attention_sink_bias"]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="attention_sink_bias"):
        load_model(str(tmp_path))


def test_the_weights_estimate_is_what_the_model_holds(built):
    from pagoda.runtime.server.weights import from_shapes

    c = read_model_config(str(built[0]))
    held = sum(p.numel() for p in built[1].parameters())
    held += sum(b.numel() for n, b in built[1].named_buffers() if "correction_bias" in n)
    assert from_shapes(c, torch.float32, False) == held * 4


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_two_ranks_match_transformers(built):
    """Two ranks: each its two query heads (and their sinks), the sliding layers' two KV heads
    split, the full layers' one replicated, values narrower than keys, the experts by width;
    transformers' tokens and logits chunked, preempted and on a warm cache; rank 0's weights
    as the estimate counts them."""
    from model_bytes import check_estimate

    path, _, loaded, reference = built
    check_two_ranks(path, loaded, reference, "mimo_v2_flash")
    check_estimate(path, 2, rel=0)


def test_fp8_is_refused_in_one_line(built):
    with pytest.raises(ValueError, match="not supported for a mimo_v2_flash model") as e:
        LLM(loaded=built[2], dtype="float32", quantization="fp8")
    assert "\n" not in str(e.value)


def test_an_fp8_checkpoint_is_refused_in_one_line(built, tmp_path):
    """The published checkpoint's form (block-wise FP8): not tested here, so refused."""
    cfg = json.loads((built[0] / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": [128, 128]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="FP8 mimo_v2_flash checkpoint is not supported") as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("tp", [1, 2])
def test_the_weights_from_shapes_as_from_its_tensors(built, tp):
    """`fit`'s count from config.json alone (`from_shapes`, 16 bits, one rank's share) against
    the headers' as CUDA holds them: each layer's KV heads by its kind (split or
    replicated), values narrower than keys, the sinks in float32 by the rank's heads."""
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    path = built[0]
    mc = read_model_config(str(path))
    ckpt = weights.read_checkpoint(path, mc.architecture)
    got, _ = weights.resident(ckpt, mc, Placement(torch.bfloat16, "cuda", tp, None))
    assert got == weights.from_shapes(mc, torch.bfloat16, False, tp)
