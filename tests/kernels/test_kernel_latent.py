"""paged_attention on a latent cache (DeepSeek's multi-head latent attention): one tensor passed
as both K and V cache, one KV head of DeepSeek's 576-wide rows (kv_lora_rank 512 + rope 64, not a
power of two), the values the rows' first 512 columns (`runtime/attention/triton_backend.py`)."""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL
from pagoda.kernels import reference

WIDTH, LATENT, HEADS, BLOCK = 576, 512, 4, 16


@pytest.mark.parametrize("path", [{"num_kv_splits": 2}, {"flash_prefill": False}],
                         ids=["split-decode+prefill", "unified"])  # fmt: skip
def test_one_tensor_is_read_as_keys_and_values(device, path):
    _check_latent(device, path, HEADS)


def test_more_query_heads_than_one_tile_holds_are_attended_in_groups(device):
    """DeepSeek-V3's 128 heads of 576 in one tile needed 393 kB of shared memory on sm_90
    (sm90_compile.py's latent-d576-h128 case); paged_attention launches at most
    `max_query_heads` of them at a time (8 in float32 here: groups of 8, 8 and 4)."""
    from pagoda.kernels.attention import max_query_heads

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    group = max_query_heads(torch.empty(1, 1, WIDTH, dtype=dtype))
    assert group == (8 if dtype == torch.float32 else 16)
    _check_latent(device, {"num_kv_splits": 2}, 2 * group + group // 2)


def _check_latent(device, path, heads):
    from pagoda.kernels import paged_attention, write_kv_cache

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    seq_lens, query_lens = [40, 37], [1, 21]  # a decode, a chunk on cached context
    tables = torch.tensor([[5, 1, 7], [0, 3, 2]], dtype=torch.int32, device=device)
    cache = torch.zeros(8, BLOCK, 1, WIDTH, dtype=dtype, device=device)
    rows = torch.randn(sum(seq_lens), 1, WIDTH, dtype=dtype, device=device)
    slots = torch.cat([tables[i, torch.arange(n, device=device) // BLOCK] * BLOCK
                       + torch.arange(n, device=device) % BLOCK
                       for i, n in enumerate(seq_lens)]).long()  # fmt: skip
    write_kv_cache(k=rows, v=rows, k_cache=cache, v_cache=cache, slot_mapping=slots)
    q = torch.randn(sum(query_lens), heads, WIDTH, dtype=dtype, device=device)
    args = dict(
        q=q, k_cache=cache, v_cache=cache, block_tables=tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, 1, 22], dtype=torch.int32, device=device),
        max_query_len=21, max_seq_len=40, scale=0.05, num_decodes=1,
    )  # fmt: skip
    got = paged_attention(**args, **path)
    want = reference.paged_attention(**args)
    assert torch.equal(cache.view(-1, WIDTH)[slots], rows.view(-1, WIDTH))
    torch.testing.assert_close(got[..., :LATENT], want[..., :LATENT], **TOL[dtype])
