"""Hyper-connections (`model/hyper_connection.py`) against transformers' own modules with the
same weights, in float32 over a ragged batch flattened to tokens: DeepSeek-V4's mHC
(``DeepseekV4HyperConnection``: pre, post, the Sinkhorn-Knopp ``comb``, the merged streams;
``DeepseekV4HyperHead``) and HY V4's independent form (``HYV4HyperConnection`` /
``HYV4HyperHead``: no ``comb``, ``hc_magnitude``)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model.hyper_connection import HyperConnection, HyperHead, expand
from pagoda.runtime.model_configs import HyperConfig

transformers = pytest.importorskip("transformers")
D, N = 24, 4


def _randomized(module, g):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def _case(form: str):
    """(HyperConfig, transformers' connection, its head) with random weights."""
    g = torch.Generator().manual_seed(0)
    if form == "mhc":
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        c = transformers.DeepseekV4Config(hidden_size=D, hc_mult=N, hc_sinkhorn_iters=5,
                                          hc_eps=1e-3, rms_norm_eps=1e-6)  # fmt: skip
        conn, head = m.DeepseekV4HyperConnection(c), m.DeepseekV4HyperHead(c)
        cfg = HyperConfig(N, 5, 1e-3, 1e-6)
    else:
        from transformers.models.hy_v4 import modeling_hy_v4 as m

        c = transformers.HYV4Config(hidden_size=D, hc_mult=N, hc_magnitude=1.5, hc_eps=1e-3,
                                    rms_norm_eps=1e-5)  # fmt: skip
        conn, head = m.HYV4HyperConnection(c), m.HYV4HyperHead(c)
        cfg = HyperConfig(N, 0, 1e-3, 1e-5, post_magnitude=1.5)
    return cfg, _randomized(conn.float(), g), _randomized(head.float(), g)


@pytest.mark.parametrize("form", ["mhc", "hy_v4"])
def test_connection_and_head_match_transformers(form):
    cfg, conn, head = _case(form)
    g = torch.Generator().manual_seed(1)
    lens = (5, 1, 3)  # a ragged batch: transformers pads it to [B, S]; the engine flattens it
    batch = torch.randn(len(lens), max(lens), N, D, generator=g) * 2
    tokens = torch.cat([batch[b, :n] for b, n in enumerate(lens)])  # [T, N, D]
    y = torch.randn(len(lens), max(lens), D, generator=g)
    y_tokens = torch.cat([y[b, :n] for b, n in enumerate(lens)])
    ours = HyperConnection(cfg, conn.fn.data, conn.base.data, conn.scale.data)
    post, comb, collapsed = ours(tokens)
    with torch.no_grad():
        if form == "mhc":
            t_post, t_comb, t_collapsed = conn(batch)
            t_next = t_post.unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(
                t_comb.transpose(-1, -2), batch
            )
        else:
            t_post, t_collapsed = conn(batch)
            t_comb = None
            t_next = t_post.unsqueeze(-1) * y.unsqueeze(-2) + batch  # HYV4DecoderLayer's
        t_head = head(batch)

    def flat(t):
        return torch.cat([t[b, :n] for b, n in enumerate(lens)])

    torch.testing.assert_close(post, flat(t_post), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(collapsed, flat(t_collapsed), rtol=1e-6, atol=1e-6)
    if form == "mhc":
        torch.testing.assert_close(comb, flat(t_comb), rtol=1e-6, atol=1e-6)
        # doubly stochastic, up to hc_eps in the normalisations
        torch.testing.assert_close(comb.sum(-2), torch.ones(len(tokens), N), atol=2e-3, rtol=0)
    else:
        assert comb is None
    torch.testing.assert_close(ours.merge(tokens, post, comb, y_tokens), flat(t_next),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    ours_head = HyperHead(cfg, head.hc_fn.data, head.hc_base.data, head.hc_scale.data)
    torch.testing.assert_close(ours_head(tokens), flat(t_head), rtol=1e-6, atol=1e-6)
    assert torch.equal(expand(tokens[:, 0], N)[:, 2], tokens[:, 0])


def test_sinkhorn_iters_must_not_be_negative():
    with pytest.raises(ValueError, match="hc_sinkhorn_iters must be >= 0"):
        HyperConfig(4, -1, 1e-6, 1e-6)
