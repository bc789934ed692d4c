"""A query row's attention output is bit-identical however its step is composed, on both CPU paths.

The same row (position `pos` of one sequence) is computed as a decode, inside prefill chunks of
several sizes, inside a fresh prompt, beside other sequences, with its context in other cache
blocks, and (kernel) with the scores split into many waves. Contexts are long enough to span
several of the kernel's score tasks; head shapes cover a tile holding several rows (GQA group 3)
and a group larger than a tile (8 heads per KV head)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_testlib import step_meta
from pagoda.runtime.attention.torch_backend import TorchAttentionBackend
from pagoda.runtime.cpu import attention as cpu_attention

BS = 16


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch) -> str:
    monkeypatch.setenv(cpu_attention.ENV_SWITCH, request.param)
    if request.param == "kernel" and cpu_attention.load() is None:
        pytest.fail("the CPU attention kernel did not build on this machine (is g++ installed?)")
    return request.param


class Row:
    """One sequence's K/V/Q, and steps whose query rows include its position `pos`."""

    def __init__(self, h, hkv, d, n, dtype, seed=0, window=None):
        self.g = torch.Generator().manual_seed(seed)
        self.shape, self.dtype, self.window = (h, hkv, d), dtype, window
        self.k, self.v, self.q = (self._randn(n, x) for x in (hkv, hkv, h))
        self.be = TorchAttentionBackend(h, hkv, d, d**-0.5, sliding_window=window)

    def _randn(self, n, heads) -> torch.Tensor:
        return torch.randn(n, heads, self.shape[2], generator=self.g).to(self.dtype)

    def output(self, pos, table, last=None, new=1, others=(), wave=None) -> torch.Tensor:
        """Row `pos` of a step where this sequence's query rows are the `new` positions ending at
        `last` (default `pos`), the earlier ones cached; `others` = [(context, new)] sequences
        with random contents share the step."""
        h, hkv, _ = self.shape
        last = pos if last is None else last
        kc, vc = self.be.allocate_kv_cache(512, BS, self.dtype, torch.device("cpu"))
        free = iter(range(400, 512))
        seqs = [(last + 1, new, table)]
        seqs += [(c, m, [next(free) for _ in range(-(-c // BS))]) for c, m in others]
        seqs.sort(key=lambda s: s[1] != 1)  # decodes first
        qs, ks, vs, slots = [], [], [], []
        for c, m, t in seqs:
            mine = t is table
            kk = self.k[:c] if mine else self._randn(c, hkv)
            vv = self.v[:c] if mine else self._randn(c, hkv)
            qs.append(self.q[c - m : c] if mine else self._randn(m, h))
            cached = torch.tensor(
                [t[p // BS] * BS + p % BS for p in range(c - m)], dtype=torch.long
            )
            self.be.write_kv(kk[: c - m], vv[: c - m], kc, vc, cached)
            ks.append(kk[c - m :])
            vs.append(vv[c - m :])
            slots += [t[p // BS] * BS + p % BS for p in range(c - m, c)]
        meta = step_meta(seqs, slots, BS)
        self.be.prepare(meta)
        q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
        if wave is None:
            out = self.be.forward(q, k, v, kc, vc, meta, window=self.window)
        else:  # the kernel with a small score budget: many waves
            self.be.write_kv(k, v, kc, vc, meta.slot_mapping)
            aux = meta.aux
            out = self.be.kernel.attention(
                q, kc, vc, meta.block_tables, aux["qstart"], aux["seq_lens"], self.be.scale, wave
            )
        mine = [s[2] is table for s in seqs].index(True)
        return out[int(meta.query_start_loc[mine]) + pos - (last + 1 - new)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (8, 1, 64), (6, 2, 32)])
def test_row_is_bit_identical_however_the_step_is_composed(path, dtype, h, hkv, d):
    n, pos = 1200, 1100  # 69 blocks of context: several score tasks in the kernel
    r = Row(h, hkv, d, n, dtype)
    nblk = -(-n // BS)
    near = list(range(1, 1 + nblk))  # consecutive blocks, as a fresh pool hands them out
    perm = np.random.default_rng(0).permutation(np.arange(100, 100 + 3 * nblk))
    far = [int(b) for b in perm[:nblk]]
    want = r.output(pos, near)  # a decode
    got = {
        "other blocks": r.output(pos, far),
        "chunk of 40": r.output(pos, near, new=40),
        "middle of a chunk of 7": r.output(pos, near, last=pos + 3, new=7),
        "first row of a chunk": r.output(pos, far, last=pos + 20, new=21),
        "fresh prompt": r.output(pos, far, new=pos + 1),
        "fresh prompt, longer": r.output(pos, near, last=n - 1, new=n),
        "beside others": r.output(pos, near, others=[(50, 1), (700, 1), (30, 12), (300, 64)]),
    }
    if path == "kernel":
        got["many waves"] = r.output(pos, near, last=pos + 5, new=40, others=[(300, 64)], wave=4096)
    for name, out in got.items():
        assert torch.equal(out, want), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [37, 700])
def test_window_row_is_bit_identical_however_the_step_is_composed(path, dtype, window):
    """A window layer's row: chunks whose first row's window starts elsewhere read other keys
    before the row's own window, and the row keeps its bits."""
    n, pos = 1200, 1100
    r = Row(9, 3, 64, n, dtype, window=window)
    nblk = -(-n // BS)
    near = list(range(1, 1 + nblk))
    far = [int(b) for b in np.random.default_rng(0).permutation(np.arange(100, 100 + 3 * nblk))]
    want = r.output(pos, near)  # a decode
    got = {
        "other blocks": r.output(pos, far[:nblk]),
        "chunk of 40": r.output(pos, near, new=40),
        "chunk of 300": r.output(pos, far[:nblk], last=pos + 3, new=300),
        "fresh prompt": r.output(pos, far[:nblk], new=pos + 1),
        "beside others": r.output(pos, near, others=[(50, 1), (700, 1), (30, 12), (300, 64)]),
    }
    for name, out in got.items():
        assert torch.equal(out, want), name
