"""DeepSeek-V4's attention layer stepped over paged rows (`dsv4_layer`) against transformers'
``DeepseekV4Attention`` with the same weights: two sequences of unequal length stepped together
in ragged chunks (one-token steps among them) through shuffled block tables, the compressors'
open-window slots carried between steps, give each token transformers' output over its whole
sequence (sliding, CSA with its indexer's top-2, HCA 8:1), float32."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.model import dsv4_config
from pagoda.runtime.model.dsv4_layer import Batch, Dsv4Attention, Dsv4Cache
from test_dsv4_attention import KINDS, _config

transformers = pytest.importorskip("transformers")
HID, BS = 32, 8
LENS, STEPS = (23, 17), ((9, 5), (1, 1), (13, 11))


@pytest.mark.parametrize("layer", range(3), ids=KINDS)
def test_stepped_layer_matches_transformers(layer):
    from transformers.masking_utils import create_sliding_window_causal_mask
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = _config()
    torch.manual_seed(layer)
    attn = m.DeepseekV4Attention(cfg, layer).float().eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape) * (0.4 if p.dim() > 1 else 1.0))
    rotary = m.DeepseekV4RotaryEmbedding(cfg)
    xs = [torch.randn(n, HID) for n in LENS]
    want = []
    with torch.no_grad():
        for x in xs:
            pos = torch.arange(x.shape[0])[None]
            mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=x[None],
                                                     attention_mask=None, cache=None,
                                                     position_ids=pos)  # fmt: skip
            tables = {
                t: rotary(x[None], position_ids=pos, layer_type=t) for t in ("main", "compress")
            }
            want.append(attn(x[None], tables, pos, mask)[0][0])

    c = dsv4_config.read(cfg.to_dict())
    ours = Dsv4Attention(c, layer, attn.state_dict())
    nb = 8
    tables = torch.randperm(nb, generator=torch.Generator().manual_seed(9)).view(2, nb // 2)
    rate = c.compress_rates[layer] or BS
    d, di = c.head_dim, c.index_head_dim
    cache = Dsv4Cache(torch.zeros(nb * BS, d),
                      {"kv": torch.zeros(nb, BS // rate, d), "index": torch.zeros(nb, BS // rate, di)},
                      {"kv": torch.zeros(nb, rate, 4 * d), "index": torch.zeros(nb, rate, 4 * di)})  # fmt: skip
    done = torch.zeros(2, dtype=torch.long)
    got = [[], []]
    with torch.no_grad():
        for counts in STEPS:
            count = torch.tensor(counts)
            seq = torch.repeat_interleave(torch.arange(2), count)
            pos = torch.cat(
                [torch.arange(int(a), int(a + n)) for a, n in zip(done, count, strict=True)]
            )
            x = torch.cat([xs[i][int(done[i]) : int(done[i] + count[i])] for i in range(2)])
            out = ours(x, Batch(tables, seq, pos, done, count, BS), cache)
            for i in range(2):
                got[i].append(out[seq == i])
            done = done + count
    for i in range(2):
        torch.testing.assert_close(torch.cat(got[i]), want[i], rtol=1e-4, atol=1e-4)


def test_batch_from_the_engine_metadata():
    """A step's `AttentionMetadata` (a decode, then two prefill chunks) read as the layer's
    `Batch`: each token's sequence, the tokens cached before the step, the step's counts."""
    from pagoda.runtime.attention.base import AttentionMetadata

    tables = torch.tensor([[3, 0], [1, 2], [4, 5]], dtype=torch.int32)
    meta = AttentionMetadata(num_seqs=3, num_decodes=1, num_tokens=6, max_query_len=3,
                             max_seq_len=12, query_start_loc=torch.tensor([0, 1, 4, 6], dtype=torch.int32),
                             seq_lens=torch.tensor([12, 3, 10], dtype=torch.int32),
                             block_tables=tables, slot_mapping=torch.zeros(6, dtype=torch.long),
                             block_size=8)  # fmt: skip
    positions = torch.tensor([11, 0, 1, 2, 8, 9])
    b = Batch.from_meta(meta, positions)
    assert b.seq.tolist() == [0, 1, 1, 1, 2, 2]
    assert b.count.tolist() == [1, 3, 2] and b.done.tolist() == [11, 0, 8]
    assert (b.pos == positions).all() and b.block_size == 8 and b.block_tables is tables
