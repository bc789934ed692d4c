"""DeepSeek-V4's whole model stepped over paged caches (`dsv4_model`, outside the engine), read
from the checkpoint transformers' ``DeepseekV4ForCausalLM.save_pretrained`` writes
(`dsv4_config`'s names): two prompts of unequal length prefilled together in ragged chunks, then
decoded together, give transformers' plain greedy tokens (sliding, CSA and HCA layers, hash and
sqrtsoftplus MoE, mHC), float32."""

from __future__ import annotations

import json

import pytest
import torch
from pagoda.runtime.model import dsv4_config as D
from pagoda.runtime.model.dsv4_layer import Batch, Dsv4Cache
from pagoda.runtime.model.dsv4_model import Dsv4Model
from test_dsv4_model import _model

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
BS, NEW = 8, 6
CHUNKS = ((5, 3), (8, 6))  # the prompts (13 and 9 tokens) in two ragged steps


def _greedy(model, prompt):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_stepped_model_from_checkpoint_matches_transformers_greedy(tmp_path):
    cfg, model = _model()
    model.save_pretrained(tmp_path)
    config = D.read(json.loads((tmp_path / "config.json").read_text()))
    stored = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    names = D.check_headers(config, {k: ("F32", list(v.shape)) for k, v in stored.items()})
    ours = Dsv4Model(config, {k: stored[s] for k, s in names.items()})
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (13, 9)]
    want = [_greedy(model, p) for p in prompts]

    tables = torch.randperm(8, generator=g).view(2, 4)
    caches = ours.new_caches(12, BS, torch.float32)
    done, out = torch.zeros(2, dtype=torch.long), [[], []]
    steps = [*CHUNKS, *[(1, 1)] * (NEW - 1)]
    with torch.no_grad():
        for counts in steps:
            count = torch.tensor(counts)
            seq = torch.repeat_interleave(torch.arange(2), count)
            pos = torch.cat(
                [torch.arange(int(a), int(a + n)) for a, n in zip(done, count, strict=True)]
            )
            full = [p + o for p, o in zip(prompts, out, strict=True)]
            ids = torch.tensor([full[int(s)][int(t)] for s, t in zip(seq, pos, strict=True)])
            logits = ours(ids, Batch(tables, seq, pos, done, count, BS), caches)
            done = done + count
            last = torch.cumsum(count, 0) - 1
            for i in range(2):
                if done[i] >= len(prompts[i]):  # a prompt complete: its next token
                    out[i].append(int(logits[last[i]].argmax()))
    assert out == want

    # a prefix-cache hit: a third prompt sharing prompt 0's first block (8 tokens), its CSA
    # slots restored from that block's Ca tail, stepped alone with fresh slots
    third = prompts[0][:BS] + torch.randint(0, cfg.vocab_size, (5,), generator=g).tolist()
    table = torch.tensor([[int(tables[0, 0]), 8, 9, 10]])
    hit = [Dsv4Cache(c.rows, c.entries, c.tails) for c in caches]
    done, got, rows = torch.tensor([BS]), [], []
    with torch.no_grad():
        for n in [5] + [1] * (NEW - 1):
            pos = torch.arange(int(done[0]), int(done[0]) + n)
            full = third + got
            ids = torch.tensor([full[int(t)] for t in pos])
            restored = torch.tensor([int(done[0]) == BS])
            batch = Batch(table, torch.zeros(n, dtype=torch.long), pos, done, torch.tensor([n]), BS,
                          restored)  # fmt: skip
            rows.append(ours(ids, batch, hit))
            got.append(int(rows[-1][-1].argmax()))
            done = done + n
    assert got == _greedy(model, third)
    with torch.no_grad():  # every stepped position's logits, not only the picks
        full = model(torch.tensor([third + got[:-1]])).logits[0, BS:]
    torch.testing.assert_close(torch.cat(rows), full, rtol=1e-4, atol=1e-4)
