"""Jamba (`JambaForCausalLM`) beyond the token-for-token case of test_hybrid_ssm.py (the
"jamba" entry of tests/runtime/hybrid_cases.py: chunked, batched, preempted against
transformers' slow torch path): the weights estimate against the built model, the checkpoint
check naming a missing norm of the mixer, 16/32 bits only (FP8 refused in one line), two
tensor-parallel ranks, and AI21-Jamba-1.5-Mini's config.json read without weights."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hybrid_cases import check_refused
from pagoda.runtime.distributed.layout import mamba_problem

transformers = pytest.importorskip("transformers")

# AI21-Jamba-1.5-Mini's config.json (the fields the runtime reads)
MINI = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "attn_layer_offset": 4,
        "attn_layer_period": 8, "bos_token_id": 1, "eos_token_id": [2, 518],
        "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "mamba_conv_bias": True,
        "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_dt_rank": 256, "mamba_expand": 2,
        "mamba_proj_bias": False, "max_position_embeddings": 262144, "num_attention_heads": 32,
        "num_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "sliding_window": None,
        "tie_word_embeddings": False, "use_mamba_kernels": True, "vocab_size": 65536}  # fmt: skip


def test_jamba_estimates_and_refusals(built):
    """The weights estimate within 2% of the built model, the config-only one (`from_shapes`)
    the checkpoint's exactly (one rank and two); state slots of Mamba-1's conv and
    SSM states on the two Mamba layers, a KV cache on the two attention layers; FP8 refused in
    one line (Mamba-1's mixers do not run in FP8), and a tensor-parallel size that does not
    divide the mixers' channels."""
    from model_bytes import check_estimate
    from pagoda.runtime.config import EngineConfig
    from pagoda.runtime.server import memory, weights
    from pagoda.runtime.server.placement import Placement

    path, _, loaded, _ = built("jamba", reference=False)
    mc = loaded.config
    assert mc.family.mamba.layers == (True, False, True, False) and mc.num_kv_layers == 2
    assert mc.family.moe_layers == (True, False, False, True) and not mc.family.norm_topk_prob
    check_estimate(path, rel=0.02)
    table = weights.read_checkpoint(path, mc.architecture)
    for tp in (1, 2):  # the config-only count (A_log and D in float32) as the checkpoint's
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert weights.from_shapes(mc, torch.bfloat16, False, tp) == got
    cfg = EngineConfig.create(str(path), device="cpu", dtype="float32", max_num_seqs=8)
    parts = memory.check(mc, cfg, path, 256).parts()
    assert parts["Mamba state"] == 8 * 2 * (128 * 3 + 128 * 8) * 4
    check_refused("jamba", mc)
    half = dataclasses.replace(mc.family.mamba, head_dim=130)  # (d_inner 130 over 4 ranks)
    assert "does not divide the Mamba mixers' channels (mamba d_inner 130)" in mamba_problem(
        half, 4
    )
    assert mamba_problem(mc.family.mamba, 2) is None


@pytest.mark.slow  # a second process (gloo): ~5 s on 2 busy cores
def test_jamba_two_ranks_match_transformers(built):
    """Two ranks: each Mamba-1 mixer by channels of d_inner (in_proj's x and z rows, the conv,
    dt_proj, A and D; x_proj and out_proj by input columns, dt/B/C all-reduced), each rank's
    state slots its 64 of the 128 channels; attention by heads, the experts and MLPs by width.
    The small pool (16-token chunks, preempted and recomputed), then from the prefix cache
    (each rank's snapshots of its channels): transformers' tokens and logits; rank 0's weights
    as the estimate counts them."""
    from arch_cases import SMALL_POOL, check, generate, prompts
    from model_bytes import check_estimate
    from pagoda.runtime import LLM

    path, _, loaded, reference = built("jamba")
    with LLM(str(path), loaded=loaded, tensor_parallel_size=2, **SMALL_POOL) as two:
        got = generate(two, prompts()) + generate(two, prompts()[::-1])[::-1]
        core = two.engine
        assert core.scheduler.num_preemptions > 0 and core.kv.prefix_hits > 0
        conv, ssm = core.runner.mamba.states[0]  # this rank's channels
        assert conv.shape[1:] == (64, 3) and ssm.shape[1:] == (1, 64, 8)
        core.check_integrity()
    for i, g in enumerate(got):
        check(g, reference[i % 3], f"jamba: prompt {i}, two ranks")
    check_estimate(path, 2, rel=0)


def test_jamba_checkpoint_without_a_mixer_norm_is_refused(built, tmp_path):
    from pagoda.runtime.model.loader import read_model_config
    from safetensors.torch import load_file, save_file

    path = built("jamba", reference=False)[0]
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.2.mamba.b_layernorm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.2\.mamba\.b_layernorm"):
        read_model_config(str(tmp_path))


def test_jamba_1_5_mini_config(tmp_path):
    """AI21-Jamba-1.5-Mini: attention on 4 of 32 layers (4, 12, 20, 28), experts on the odd
    ones, d_inner 8192, dt rank 256; 51.6B parameters, the config-only weights estimate as
    a checkpoint of those shapes gives (one rank and two); a bad period refused in one line."""
    from pagoda.runtime.model.loader import read_model_config
    from pagoda.runtime.server import weights
    from pagoda.runtime.server.placement import Placement

    (tmp_path / "config.json").write_text(json.dumps(MINI))
    mc = read_model_config(str(tmp_path))
    m, f = mc.family.mamba, mc.family
    assert [i for i in range(32) if not m.layers[i]] == [4, 12, 20, 28] and mc.num_kv_layers == 4
    assert [i for i in range(32) if f.has_experts(i)] == list(range(1, 32, 2))
    assert (m.d_inner, m.dt_rank, m.d_state, f.num_experts, f.moe_intermediate_size) == (
        8192,
        256,
        16,
        16,
        14336,
    )
    assert f.rope_layers == (False,) * 32 and mc.family.sliding_window is None
    assert 51.3e9 < mc.num_params < 51.9e9  # "52B total parameters"
    table = _published_table(mc)  # the config-only count as a checkpoint of its shapes'
    for tp in (1, 2):
        got, _ = weights.resident(table, mc, Placement(torch.bfloat16, "cuda", tp, None))
        assert weights.from_shapes(mc, torch.bfloat16, False, tp) == got
    (tmp_path / "config.json").write_text(json.dumps({**MINI, "attn_layer_offset": 8}))
    with pytest.raises(ValueError, match=r"attn_layer_offset \(8\) must be in \[0, "):
        read_model_config(str(tmp_path))


def _published_table(mc):
    """A bf16 checkpoint's tensor table of `mc`'s shapes (`checkpoint_shapes.expected_shapes`,
    with the MLPs and experts it checks apart)."""
    from pagoda.runtime.model.checkpoint_shapes import expected_shapes
    from pagoda.runtime.server.stored import Checkpoint, Stored

    shapes, h, f = dict(expected_shapes(mc)), mc.hidden_size, mc.family
    for i in range(mc.num_layers):
        p, w = f"model.layers.{i}.feed_forward.", mc.intermediate_size
        mlps = [p]
        if f.has_experts(i):
            mlps, w = [f"{p}experts.{e}." for e in range(f.num_experts)], f.moe_intermediate_size
        for q in mlps:
            shapes |= {q + "gate_proj.weight": (w, h), q + "up_proj.weight": (w, h),
                       q + "down_proj.weight": (h, w)}  # fmt: skip
    table = {n: Stored(n, "BF16", s, 2 * torch.Size(s).numel()) for n, s in shapes.items()}
    return Checkpoint("safetensors", table, 0)
