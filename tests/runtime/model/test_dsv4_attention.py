"""DeepSeek-V4's attention math (`model/dsv4_attention.py`, with `dsv4_compressor`) against
transformers' ``DeepseekV4Attention`` with the same weights, float32, a 23-token sequence with no
cache: a sliding layer, a CSA layer (its indexer picking 2 of the 4:1 entries, so that its
choice matters) and an HCA layer (8:1), each with a 6-token window."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import dsv4_attention as A
from pagoda.runtime.model.dsv4_compressor import compress, entry_positions, rotate_trailing

transformers = pytest.importorskip("transformers")
H, D, L, HEADS = 32, 16, 23, 4
KINDS = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")


def _config():
    cfg = transformers.DeepseekV4Config(
        hidden_size=H, head_dim=D, partial_rotary_factor=0.5, num_hidden_layers=3,
        num_attention_heads=HEADS, q_lora_rank=16, index_n_heads=2, index_head_dim=8,
        index_topk=2, layer_types=list(KINDS), sliding_window=6, o_groups=2, o_lora_rank=8,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        vocab_size=64, n_routed_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    return cfg


def _entries(module, x, rate, overlap, rope):
    usable = x.shape[1] // rate * rate
    kv, gate = module.kv_proj(x[:, :usable]), module.gate_proj(x[:, :usable])
    e = compress(kv, gate, module.position_bias, module.kv_norm.weight,
                 module.kv_norm.variance_epsilon, rate, overlap)  # fmt: skip
    cos, sin = rope(e, entry_positions(e.shape[1], rate, x.device)[None], "compress")
    return rotate_trailing(e, cos, sin)


def _ours(attn, cfg, x, rope):
    kind = attn.layer_type
    table = "main" if kind == "sliding_attention" else "compress"
    pos = torch.arange(L)[None]
    cos, sin = rope(x, pos, table)
    q_res = A.rms(attn.q_a_proj(x), cfg.rms_norm_eps, attn.q_a_norm.weight)
    q = A.rms(attn.q_b_proj(q_res).view(1, L, HEADS, D), cfg.rms_norm_eps)
    q = rotate_trailing(q, cos[:, :, None], sin[:, :, None])
    rows = rotate_trailing(A.rms(attn.kv_proj(x), cfg.rms_norm_eps, attn.kv_norm.weight), cos, sin)
    entries = mask = None
    if kind != "sliding_attention":
        rate = cfg.compress_rates[kind]
        csa = kind == "compressed_sparse_attention"
        entries = _entries(attn.compressor, x, rate, csa, rope)
        if csa:
            ix = attn.compressor.indexer
            keys = _entries(ix, x, rate, True, rope)
            qi = ix.q_b_proj(q_res).view(1, L, ix.num_heads, ix.head_dim)
            ci, si = rope(x, pos, "compress")
            qi = rotate_trailing(qi, ci[:, :, None], si[:, :, None])
            scores = A.index_scores(qi, keys, ix.scorer.weights_proj(x))
            mask = A.picked_entries(scores, rate, cfg.index_topk)
        else:
            mask = A.all_entries(L, entries.shape[1], rate, x.device)[None]
    out = A.attend(q, rows, entries, mask, cfg.sliding_window, attn.sinks, D**-0.5)
    out = A.unrotate(out, cos[:, :, None], sin[:, :, None])
    grouped = A.grouped_projection(out.reshape(1, L, cfg.o_groups, -1), attn.o_a_proj.weight,
                                   cfg.o_groups)  # fmt: skip
    return attn.o_b_proj(grouped.flatten(2))


@pytest.mark.parametrize("layer", range(3), ids=KINDS)
def test_attention_matches_transformers(layer):
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = _config()
    torch.manual_seed(layer)
    attn = m.DeepseekV4Attention(cfg, layer).float().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape) * (0.4 if p.dim() > 1 else 1.0))
    rotary = m.DeepseekV4RotaryEmbedding(cfg)

    def rope(x, pos, table):
        return rotary(x, position_ids=pos, layer_type=table)

    x = torch.randn(1, L, H)
    pos = torch.arange(L)[None]
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None,
                                             cache=None, position_ids=pos)  # fmt: skip
    with torch.no_grad():
        want = attn(x, {t: rope(x, pos, t) for t in ("main", "compress")}, pos, mask)[0]
        got = _ours(attn, cfg, x, rope)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
