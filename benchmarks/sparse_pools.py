"""A sparse layer's indexer work per decode step against context length, before and after the
pooled keys were cached (`model/side_tables.py`), side by side in one run.

Qwen4-Exp's QSA indexer (`model/qwen4_qsa.py`) at a made-up production-like shape (``--heads``
16 query heads of ``--dim`` 128, blocks of ``--ratio`` 4, 512 kept blocks, float32, CPU), one
decode step of ``--batch`` sequences of each ``--contexts`` length, in blocks of 16 scattered
over the pool: the key write and the selection (`QsaIndexer.select`: block scores, top-k, kept
slots), timed as

* **before**: the indexer as of ``--old-ref`` (default 326dd828, its source read with git and
  run against this tree's modules): every step pooled the whole context's raw keys (gather,
  mean, norm, rotary of every whole block), then scored them;
* **after**: this tree's: the step's raw keys written, the blocks its tokens end pooled into the
  block table (`PoolTable.close`), the finished blocks' keys gathered and scored.

The step's `dsa.index_plan` (shared by every layer) is built once, outside the timings; the
tokens kept by both are checked equal. Best of ``--seconds`` of calls (`common.best_seconds`).

    .venv/bin/python -P benchmarks/sparse_pools.py     # ~30 s on 2 cores
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (docs/benchmarks.md)

import argparse
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_seconds, machine, markdown_table

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 16


def old_module(ref: str) -> types.ModuleType:
    """`model/qwen4_qsa.py` as of ``ref`` (its imports: this tree's modules)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:runtime/model/qwen4_qsa.py"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    mod = types.ModuleType("qwen4_qsa_old")
    exec(compile(src, f"{ref}:qwen4_qsa.py", "exec"), mod.__dict__)
    return mod


def indexer(module, args, rope: torch.Tensor):
    """The module's `QsaIndexer` over random weights (the config fields it reads)."""
    h, d = args.heads, args.dim
    g = torch.Generator().manual_seed(0)
    tensors = {
        "l.self_attn.indexer.index_qk_proj.weight": torch.randn(h * d + d, 64, generator=g),
        "l.self_attn.indexer.q_layernorm.weight": torch.randn(d, generator=g) * 0.1,
        "l.self_attn.indexer.k_layernorm.weight": torch.randn(d, generator=g) * 0.1,
    }
    w = type("W", (), {"device": torch.device("cpu"), "__getitem__": lambda s, n: tensors[n],
                       "source": lambda s, n: tensors[n]})()  # fmt: skip
    q = SimpleNamespace(indexer_heads=h, indexer_dim=d, indexer_ratio=args.ratio,
                        indexer_blocks=args.blocks,
                        indexer_dense_limit=(args.blocks + 1) * args.ratio - 1)  # fmt: skip
    ctx = SimpleNamespace(linear=lambda t: lambda x: x @ t.T)
    return module.QsaIndexer(w, "l.", q, 1e-6, ctx, rope)


def metadata(start: int, step: int, tables: torch.Tensor):
    """The metadata of positions [start, start + step) of each sequence of ``tables``."""
    from pagoda.runtime.attention.base import AttentionMetadata

    b, n = tables.shape[0], start + step
    pos = torch.arange(start, n).expand(b, -1)  # [B, step]
    slots = (tables.gather(1, pos // BLOCK).long() * BLOCK + pos % BLOCK).flatten()
    return AttentionMetadata(
        num_seqs=b, num_decodes=b if step == 1 else 0, num_tokens=b * step, max_query_len=step,
        max_seq_len=n, query_start_loc=torch.arange(b + 1, dtype=torch.int32) * step,
        seq_lens=torch.full((b,), n, dtype=torch.int32), block_tables=tables,
        slot_mapping=slots, block_size=BLOCK, query_lens_host=[step] * b,
        seq_lens_host=[n] * b,
    )  # fmt: skip


def run(args) -> list[list[object]]:
    from pagoda.runtime.model import qwen4_qsa
    from pagoda.runtime.model.dsa import index_plan
    from pagoda.runtime.model.side_tables import POOLS

    rope = torch.randn(max(args.contexts) + 1, args.dim)
    new, old = indexer(qwen4_qsa, args, rope), indexer(old_module(args.old_ref), args, rope)
    rows = []
    for n in args.contexts:
        nb = n // BLOCK * args.batch
        g = torch.Generator().manual_seed(n)
        tables = torch.randperm(nb + 8, generator=g)[:nb].view(args.batch, -1).int()
        cache = torch.empty(nb + 8, BLOCK, 1, args.dim)  # (what the tables go with)
        slots = cache.shape[0] * BLOCK
        raw = torch.randn(slots, args.dim, generator=g)  # every slot's raw key
        old.keys, old.owner = raw.clone(), cache.data_ptr()
        new.keys.bind(cache, slots, raw.dtype)[:slots] = raw
        new.blocks_table.bind(cache, slots, raw.dtype, BLOCK)
        for s0 in range(0, n - 1, 4096):  # the context's blocks (but the last token's)
            new.blocks_table.close(metadata(s0, min(4096, n - 1 - s0), tables), new._block_keys)
        meta = metadata(n - 1, 1, tables)  # the decode step: each sequence's last token
        meta.aux[qwen4_qsa.POSITIONS] = torch.full((args.batch,), n - 1)
        xs = torch.randn(args.batch, 64, generator=g)
        index_plan(meta)  # (once a step, shared by the layers: outside the timings)

        def step(ix, meta=meta, xs=xs, cache=cache, slots=slots):
            meta.aux.pop(POOLS, None)
            q = ix.query_and_store(xs, meta, cache, slots)
            return ix.select(q, meta)

        a, b = step(old), step(new)
        assert torch.equal(a[0][a[1]], b[0][b[1]]), "the kept slots differ"
        before = best_seconds(lambda ix=old: step(ix), args.seconds)
        after = best_seconds(lambda ix=new: step(ix), args.seconds)
        rows.append([n, args.batch, f"{before * 1e3:.3f}", f"{after * 1e3:.3f}",
                     f"{before / after:.1f}x"])  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32768])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ratio", type=int, default=4)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--old-ref", default="326dd828")
    args = p.parse_args()
    print(machine())
    rows = run(args)
    print(markdown_table(["context", "sequences", "before ms", "after ms", "before / after"],
                         rows))  # fmt: skip


if __name__ == "__main__":
    main()
