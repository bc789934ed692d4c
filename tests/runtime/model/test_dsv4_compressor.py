"""DeepSeek-V4's compressors as pure functions of token rows (`model/dsv4_compressor.py`)
against transformers' own ``DeepseekV4CSACompressor`` / ``DeepseekV4HCACompressor`` with the
same weights (float32): the entries of a 23-token sequence computed in one call, and the same
entries transformers builds when the sequence arrives in chunks of 5, 1, 9 and 8 tokens through
its cache (its buffer, overlap slice and running entries): both are what the token rows alone
give, which is what lets the engine keep only token rows in its paged cache."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model.dsv4_compressor import compress, entry_positions, rotate_trailing

transformers = pytest.importorskip("transformers")
H, D, L = 32, 16, 23
RATES = {"csa": 4, "hca": 8}  # (the config below)


def _config():
    return transformers.DeepseekV4Config(
        hidden_size=H, head_dim=D, partial_rotary_factor=0.5, num_hidden_layers=2,
        num_attention_heads=2, q_lora_rank=16, index_n_heads=2, index_head_dim=8, index_topk=4,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        vocab_size=64, n_routed_experts=4, num_experts_per_tok=2,
    )  # fmt: skip


def _ours(module, x, rate, overlap):
    """The entries from the token rows alone (module docstring of dsv4_compressor)."""
    usable = x.shape[1] // rate * rate
    kv, gate = module.kv_proj(x[:, :usable]), module.gate_proj(x[:, :usable])
    entries = compress(kv, gate, module.position_bias, module.kv_norm.weight,
                       module.kv_norm.variance_epsilon, rate, overlap)  # fmt: skip
    pos = entry_positions(entries.shape[1], rate, x.device)[None]
    cos, sin = module.rotary_emb(entries, position_ids=pos, layer_type="compress")
    return rotate_trailing(entries, cos, sin)


@pytest.mark.parametrize("kind", list(RATES))
def test_entries_are_a_pure_function_of_the_token_rows(kind):
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = _config()
    rate = RATES[kind]
    cls = m.DeepseekV4CSACompressor if kind == "csa" else m.DeepseekV4HCACompressor
    torch.manual_seed(0)
    module = cls(cfg).float().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * (0.3 if p.dim() > 1 else 1.0))
    layer = 0 if kind == "csa" else 1
    x = torch.randn(1, L, H)
    q_res = torch.randn(1, L, cfg.q_lora_rank)
    with torch.no_grad():
        ours = _ours(module, x, rate, kind == "csa")
        assert ours.shape[1] == L // rate
        whole = module(x, q_res, torch.arange(L)[None], None, layer)[0][:, 0]
        torch.testing.assert_close(ours, whole, rtol=1e-5, atol=1e-5)
        cache = transformers.DynamicCache(config=cfg)
        start = 0
        for n in (5, 1, 9, 8):  # chunked prefill and decodes through transformers' cache
            pos = torch.arange(start, start + n)[None]
            got = module(x[:, start : start + n], q_res[:, start : start + n], pos, cache, layer)
            start += n
        torch.testing.assert_close(ours, got[0][:, 0], rtol=1e-5, atol=1e-5)


def test_routers_match_transformers():
    """DeepSeek-V4's routers (`moe_routing`): sqrtsoftplus scores + correction bias, greedy
    top-k (``DeepseekV4TopKRouter``), and the hash layers' fixed ``tid2eid[input_ids]`` experts
    weighted by the same scores (``DeepseekV4HashRouter``): the same experts and weights."""
    from pagoda.runtime.model.moe_routing import GroupedRouter, HashRouter
    from pagoda.runtime.model_configs import ExpertRouting
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = _config()
    torch.manual_seed(1)
    topk, hashed = m.DeepseekV4TopKRouter(cfg).float(), m.DeepseekV4HashRouter(cfg).float()
    with torch.no_grad():
        for r in (topk, hashed):
            r.weight.copy_(torch.randn(r.weight.shape))
        topk.e_score_correction_bias.copy_(torch.randn(cfg.n_routed_experts))
        hashed.tid2eid.copy_(torch.randint(0, cfg.n_routed_experts, hashed.tid2eid.shape))
    routing = ExpertRouting(scoring="sqrtsoftplus", topk_method="greedy", n_group=1, topk_group=1,
                            routed_scaling_factor=cfg.routed_scaling_factor)  # fmt: skip
    x, ids = torch.randn(7, H), torch.randint(0, cfg.vocab_size, (7,))

    def linear(r):
        return lambda v: torch.nn.functional.linear(v, r.weight)

    with torch.no_grad():
        _, want_w, want_ids = topk(x)
        got_w, got_ids = GroupedRouter(linear(topk), topk.e_score_correction_bias, routing,
                                       cfg.num_experts_per_tok, True)(x)  # fmt: skip
        order_got, order_want = got_ids.sort(dim=-1), want_ids.sort(dim=-1)
        assert torch.equal(order_got.values, order_want.values)
        torch.testing.assert_close(got_w.gather(1, order_got.indices),
                                   want_w.gather(1, order_want.indices))  # fmt: skip
        _, want_w, want_ids = hashed(x, ids)
        got_w, got_ids = HashRouter(linear(hashed), hashed.tid2eid, routing)(x, ids)
        assert torch.equal(got_ids, want_ids)
        torch.testing.assert_close(got_w, want_w)


@pytest.mark.parametrize("kind", list(RATES))
def test_stepped_entries_with_the_open_window_slot_are_the_whole_sequences(kind):
    """Two sequences (23 and 13 tokens) stepped together in ragged chunks, the slot carried
    between steps: every entry is emitted once, equal to `compress` over the whole sequence; at
    each window boundary the slot holds CSA's last window alone, HCA's nothing."""
    from pagoda.runtime.model.dsv4_compressor import slot_start, step_entries

    rate, overlap, c = RATES[kind], kind == "csa", 2 * D if kind == "csa" else D
    g = torch.Generator().manual_seed(5)
    lens, steps = (23, 13), ((5, 3), (1, 1), (9, 0), (0, 4), (8, 5))
    rows = [(torch.randn(n, c, generator=g), torch.randn(n, c, generator=g)) for n in lens]
    bias, w = torch.randn(rate, c, generator=g), torch.rand(D, generator=g) + 0.5
    slot_kv = slot_gate = torch.zeros(2, 0, c)
    done, got = torch.zeros(2, dtype=torch.long), [[], []]
    for qs in steps:
        q = torch.tensor(qs)
        width = max(max(qs), 1)
        new = [torch.zeros(2, width, c), torch.zeros(2, width, c)]
        for b in range(2):  # (building the test's inputs: the engine gathers them)
            a = int(done[b])
            for i in range(2):
                new[i][b, : qs[b]] = rows[b][i][a : a + qs[b]]
        entries, first, keep, slot_kv, slot_gate = step_entries(
            slot_kv, slot_gate, new[0], new[1], done, q, bias, w, 1e-6, rate, overlap
        )
        for b in range(2):
            got[b].extend((int(first[b]) + i, entries[b, i]) for i in keep[b].nonzero()[:, 0])
        done = done + q
        for b in range(2):  # the slot's length where a window just closed
            n_slot = int(done[b] - slot_start(done[b : b + 1], rate, overlap)[0])
            if int(done[b]) % rate == 0 and int(done[b]):
                assert n_slot == (rate if overlap else 0)
    for b, n in enumerate(lens):
        whole = compress(rows[b][0][None, : n // rate * rate], rows[b][1][None, : n // rate * rate],
                         bias, w, 1e-6, rate, overlap)[0]  # fmt: skip
        assert [i for i, _ in got[b]] == list(range(n // rate))
        torch.testing.assert_close(torch.stack([e for _, e in got[b]]), whole)
