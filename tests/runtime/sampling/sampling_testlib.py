"""Requests and batches for the sampler tests, built as the engine builds them."""

from __future__ import annotations

import torch
from pagoda.runtime.request import Request
from pagoda.runtime.sampling.params import SamplingParams
from pagoda.runtime.sampling.sampler import SamplingBatch

V = 64  # `batch`'s vocabulary


def requests(*params: SamplingParams, outputs: tuple[int, ...] = ()) -> list[Request]:
    """One request per `params` ("r0", "r1", ...), prompt [1, 2, 3], `outputs` already
    generated, a seeded one with its own generator."""
    out = []
    for i, p in enumerate(params):
        r = Request(f"r{i}", [1, 2, 3], p)
        for t in outputs:
            r.append_token(t)
        if p.seed is not None:
            r.generator = torch.Generator().manual_seed(p.seed)
        out.append(r)
    return out


def batch(*params: SamplingParams, vocab: int = V) -> tuple[list[Request], SamplingBatch]:
    """`requests(*params)` and their sampling batch on the CPU over a `vocab`-token vocabulary."""
    rs = requests(*params)
    return rs, SamplingBatch.build(rs, vocab, torch.device("cpu"))
