"""The two delta rules against transformers' torch rules: Gated DeltaNet's
(`model/gated_delta.py`, a decay per head: Qwen3-Next's and OLMo Hybrid's) and Kimi Delta
Attention's (`model/kda.py`, a decay per key channel: Kimi Linear's, its intra-chunk decay in
groups of one, two and all chunks). Each: `gated_delta.prefill` over three packed sequences
(3 chunks of 8, one token, a whole chunk), each from its own state, the start state of a chunk
saved for prefix caching, then one recurrent step of all three."""

from __future__ import annotations

import pytest
import torch


def _rule(name: str):
    """(prefill's rule, the recurrent step, transformers' chunked and recurrent rules, whether
    the decay is per key channel)."""
    from pagoda.runtime.model import gated_delta, kda

    if name == "gated-delta":
        from transformers.models.qwen3_next import modeling_qwen3_next as hf

        return (gated_delta.chunked, gated_delta.recurrent_step, hf.torch_chunk_gated_delta_rule,
                hf.torch_recurrent_gated_delta_rule, False)  # fmt: skip
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    return (kda.chunked, kda.recurrent_step, hf.chunk_kimi_delta_attention,
            hf.recurrent_kimi_delta_attention, True)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "group"), [("gated-delta", None), ("kda", 1), ("kda", 2), ("kda", None)]
)
def test_the_rule_is_transformers_over_the_packed_layout(name, group, monkeypatch):
    from pagoda.runtime.model import gated_delta, kda
    from pagoda.runtime.model.mamba2 import ScanGroup
    from pagoda.runtime.model.ssd import pack

    rule, step, hf_chunked, hf_recurrent, per_channel = _rule(name)
    torch.manual_seed(0)
    lens, H, K, V, chunk = [19, 1, 8], 2, 16, 8, 8
    T = sum(lens)
    if group is not None:  # DECAY_ELEMENTS as `group` chunks' decay
        monkeypatch.setattr(kda, "DECAY_ELEMENTS", group * H * chunk * chunk * K)
    decay = (H, K) if per_channel else (H,)
    q, k = torch.randn(T, H, K), torch.randn(T, H, K)
    v, g, beta = torch.randn(T, H, V), -torch.rand(T, *decay) * 2, torch.rand(T, H)
    start = torch.randn(3, H, K, V)
    ssm = torch.zeros(5, H, K, V)
    slots = torch.tensor([3, 0, 4])
    ssm[slots] = start
    p = pack(lens, chunk, 4)
    groups = [ScanGroup(grp.counts, grp.num_chunks, slots[torch.from_numpy(p.order)][slice(*grp.seqs)],
                        *(torch.from_numpy(a) for a in (grp.tokens, grp.rows, grp.chunk_of, grp.in_chunk)))
              for grp in p.groups]  # fmt: skip
    # the start state of the first sequence's second chunk saved into snapshot entry 1
    assert p.order[0] == 0 and p.groups[0].seqs[0] == 0
    groups[0].snap_chunks = torch.tensor([groups[0].counts[0]])
    groups[0].snap_entries = torch.tensor([1])
    snaps = torch.zeros(2, H, K, V)
    qn, kn = gated_delta.l2norm(q) * K**-0.5, gated_delta.l2norm(k)
    assert max(grp.num_chunks for grp in groups) > 2  # a group of several decay groups
    out = gated_delta.prefill(qn, kn, v, g, beta, ssm, groups, chunk, snaps, rule=rule)
    off = 0
    for i, n in enumerate(lens):
        rows = slice(off, off + n)
        want, final = hf_chunked(
            q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows],
            chunk_size=chunk, initial_state=start[i : i + 1], output_final_state=True,
            use_qk_l2norm_in_kernel=True)  # fmt: skip
        torch.testing.assert_close(out[rows], want[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ssm[slots[i]], final[0], atol=1e-4, rtol=1e-4)
        off += n
    first = slice(0, chunk)
    _, at_chunk = hf_recurrent(
        q[None, first], k[None, first], v[None, first], g[None, first], beta[None, first],
        initial_state=start[:1], output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    torch.testing.assert_close(snaps[1], at_chunk[0], atol=1e-4, rtol=1e-4)
    assert not snaps[0].any()
    state = ssm[slots].clone()
    x = [torch.randn(3, H, d) for d in (K, K, V)]
    gt, bt = -torch.rand(3, *decay), torch.rand(3, H)
    got = step(state, gated_delta.l2norm(x[0]) * K**-0.5, gated_delta.l2norm(x[1]), x[2], gt, bt)
    want, final = hf_recurrent(
        x[0][:, None], x[1][:, None], x[2][:, None], gt[:, None], bt[:, None],
        initial_state=ssm[slots], output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
    torch.testing.assert_close(got, want[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, final, atol=1e-5, rtol=1e-5)
