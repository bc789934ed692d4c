"""DeepSeek-V4's modules composed into its whole forward on one sequence with no cache
(`hyper_connection` mHC with Sinkhorn, `dsv4_attention`, `dsv4_compressor`, `moe_routing`'s
hash and sqrtsoftplus routers, the clamped SwiGLU experts and shared expert), against
transformers' ``DeepseekV4ForCausalLM`` on a tiny random model: the logits of every position,
float32. The engine's model (paged rows, entry tables, the open-window slot) is the design's
next step (docs/runtime.md, "DeepSeek-V4 in the engine"); this pins the math it must give."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pagoda.runtime.model import dsv4_attention as A
from pagoda.runtime.model.hy_v4 import silu_limit_and_mul
from pagoda.runtime.model.hyper_connection import HyperConnection, HyperHead, expand
from pagoda.runtime.model.moe_routing import GroupedRouter, HashRouter
from pagoda.runtime.model_configs import ExpertRouting, HyperConfig
from test_dsv4_attention import _ours as attention  # (the attention step, composed)

transformers = pytest.importorskip("transformers")
L = 23


def _model():
    cfg = transformers.DeepseekV4Config(
        hidden_size=32, head_dim=16, partial_rotary_factor=0.5, num_hidden_layers=3,
        num_attention_heads=4, q_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=2,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"], sliding_window=6, o_groups=2, o_lora_rank=8,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        vocab_size=64, n_routed_experts=4, num_experts_per_tok=2, intermediate_size=24,
        hc_mult=3, swiglu_limit=0.5,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            scale = 0.5 if p.dim() > 1 else 0.2
            p.add_(torch.randn(p.shape, generator=g) * scale)
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):
                gate.tid2eid.copy_(torch.randint(0, 4, gate.tid2eid.shape, generator=g))
            else:
                gate.e_score_correction_bias.copy_(torch.randn(4, generator=g))
    return cfg, model


def _moe(mlp, cfg, x, ids):
    routing = ExpertRouting(scoring="sqrtsoftplus", topk_method="greedy", n_group=1, topk_group=1,
                            routed_scaling_factor=cfg.routed_scaling_factor)  # fmt: skip
    gate = mlp.gate

    def linear(v):
        return F.linear(v, gate.weight)

    if hasattr(gate, "tid2eid"):
        weights, picks = HashRouter(linear, gate.tid2eid, routing)(x, ids)
    else:
        weights, picks = GroupedRouter(linear, gate.e_score_correction_bias, routing,
                                       cfg.num_experts_per_tok, True)(x)  # fmt: skip
    ex, limit = mlp.experts, cfg.swiglu_limit
    routed = torch.zeros_like(x)
    for j in range(picks.shape[1]):
        w13, w2 = ex.gate_up_proj[picks[:, j]], ex.down_proj[picks[:, j]]  # per token
        h = silu_limit_and_mul(torch.einsum("tnk,tk->tn", w13, x), limit)
        routed += torch.einsum("tkn,tn->tk", w2, h) * weights[:, j : j + 1]
    s = mlp.shared_experts
    gate_up = torch.cat([s.gate_proj(x), s.up_proj(x)], dim=-1)
    return routed + s.down_proj(silu_limit_and_mul(gate_up, limit))


def test_whole_forward_matches_transformers():
    cfg, model = _model()
    m = model.model
    hc = HyperConfig(cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)
    ids = torch.randint(0, cfg.vocab_size, (L,), generator=torch.Generator().manual_seed(3))

    def rope(x, pos, table):
        return m.rotary_emb(x, position_ids=pos, layer_type=table)

    with torch.no_grad():
        want = model(ids[None]).logits[0]
        streams = expand(m.embed_tokens(ids), cfg.hc_mult)
        for layer in m.layers:
            for conn, norm, block in ((layer.attn_hc, layer.input_layernorm, "attn"),
                                      (layer.ffn_hc, layer.post_attention_layernorm, "mlp")):  # fmt: skip
                ours = HyperConnection(hc, conn.fn, conn.base, conn.scale)
                post, comb, x = ours(streams)
                x = A.rms(x, cfg.rms_norm_eps, norm.weight)
                if block == "attn":
                    y = attention(layer.self_attn, cfg, x[None], rope)[0]
                else:
                    y = _moe(layer.mlp, cfg, x, ids)
                streams = ours.merge(streams, post, comb, y)
        head = HyperHead(hc, m.hc_head.hc_fn, m.hc_head.hc_base, m.hc_head.hc_scale)
        got = model.lm_head(A.rms(head(streams), cfg.rms_norm_eps, m.norm.weight))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got.argmax(-1) == want.argmax(-1)).all()
