"""HRM-Text (`HrmTextForCausalLM`, model/hrm_text.py) against transformers' plain greedy loop,
token for token and logits within 1e-3 (float32), on a tiny random checkpoint transformers
writes itself (in its stored layout: fused `attn.gqkv_proj` and `mlp.gate_up_proj`): two layers
a stack, 2 high cycles of 2 low cycles (12 passes, a KV cache each), z_L_init drawn; chunked
into 16-token steps, three prompts sharing steps, a warm prefix cache, a pool small enough to
preempt; on two tensor-parallel ranks too. Also the passes, the checkpoint check, the weights
estimate, transformers' parameter count and what is refused."""

from __future__ import annotations

import json

import pytest
from arch_cases import built_fixture, case_fixture, check_two_ranks, greedy_test
from hf_oracle import make_tiny_model
from pagoda.runtime.model.loader import read_model_config

transformers = pytest.importorskip("transformers")
CASES = {"hrm_text": dict(num_hidden_layers=2, head_dim=16, H_cycles=2, L_cycles=2)}


def write(name: str, path):
    """Matrices as drawn (x1: the embeddings' default scale 1 / initializer_range already
    spreads the picks; x3 saturates the weightless norms' stacks)."""
    return make_tiny_model(path, "HrmText", scale=1.0, **CASES[name])


built = built_fixture(write)
case = case_fixture(CASES)

test_greedy_matches_transformers_chunked_cached_batched_and_preempted = greedy_test()


def test_passes_checkpoint_check_estimate_and_refusals(built):
    """12 passes over the 4 layers (L's 0, 1; H's 2, 3) sharing weights, a KV cache each; the
    checkpoint check naming a missing gate or z_L_init; the weights estimate (rank 0's of two
    too); the parameter count transformers'; FP8 refused in one line."""
    from types import SimpleNamespace

    import torch
    from hybrid_cases import check_missing_refused
    from model_bytes import build, check_estimate
    from pagoda.runtime.engine.start_checks import check_dtype

    path, model, loaded, _ = built("hrm_text")
    mc = loaded.config
    assert mc.num_layers == 4 and mc.num_kv_layers == 12 and mc.num_kv_heads == mc.num_heads
    assert mc.family.hrm.order() == [0, 1, 0, 1, 2, 3] * 2
    layers = build(path, torch.float32).layers
    assert len(layers) == 12 and layers[0].qkv is layers[2].qkv and layers[4].qkv is layers[10].qkv
    assert mc.num_params == sum(p.numel() for p in model.parameters())
    check_estimate(path, rel=1e-3)  # (less the weightless norms' one vector of ones)
    check_estimate(path, 2, rel=1e-3)
    check_missing_refused(loaded, ["model.layers.3.self_attn.gate_proj.weight", "model.z_L_init"])
    engine = SimpleNamespace(quantization="fp8", torch_dtype=lambda: torch.bfloat16)
    with pytest.raises(ValueError, match="fp8 is not supported for a hrm_text"):
        check_dtype(engine, mc)


@pytest.mark.slow  # a second process (gloo)
def test_two_ranks_match_transformers(built):
    """Two ranks (gloo), the small pool then a warm cache: each rank its heads of every pass
    (q/k/v and the output gate's rows, o_proj's columns), its KV caches of the 12 passes."""
    path, _, loaded, reference = built("hrm_text")
    check_two_ranks(path, loaded, reference, "hrm_text")


def test_a_sparse_config_reads_with_transformers_defaults(tmp_path):
    """HrmTextConfig's defaults (HRM-Text-1B's shape): 16 layers a stack, 2 x (3 + 1) passes
    each, the embedding scale 1 / initializer_range, the count transformers' own."""
    import torch

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["HrmTextForCausalLM"],
                                                      "model_type": "hrm_text"}))  # fmt: skip
    t = transformers.AutoConfig.from_pretrained(tmp_path)
    o = read_model_config(str(tmp_path))
    assert o.num_kv_layers == t.num_hidden_layers == 128 and o.num_layers == 32
    assert o.family.hrm.embedding_scale == t.embedding_scale == 50.0
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(t)
    assert o.num_params == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"attention_bias": True}, "hrm_text attention_bias is not supported"),
        ({"H_cycles": 0}, "needs H_cycles >= 1"),
    ],
)
def test_what_it_does_not_run_is_refused_in_one_line(tmp_path, edit, words):
    cfg = {"architectures": ["HrmTextForCausalLM"], "model_type": "hrm_text", **edit}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=words) as e:
        read_model_config(str(tmp_path))
    assert "\n" not in str(e.value)
