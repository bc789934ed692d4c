"""Batch invariance of the CUDA path: a row's bits do not depend on the rest of the batch.

``linear`` (the matmul the runtime uses on CUDA by default) and ``paged_attention`` with
``batch_invariant=True`` must give one row the same bits whatever M is, whether the row is a
decode, the last row of a chunk on cached context or of a fresh prompt, and whatever sequences
sit beside it. On the CPU interpreter this checks the logic (with a dot that, like a GPU's MMA,
rounds a row the same wherever it sits in a tile: `row_independent_dot`); on CUDA (marked gpu)
it checks the compiled kernels at model-sized shapes, where cuBLAS and split-KV would differ.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testlib import TOL
from pagoda.kernels import reference

LINEAR_DTYPES = [torch.float32, torch.bfloat16]
pytestmark = pytest.mark.usefixtures("row_independent_dot")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", LINEAR_DTYPES, ids=str)
def test_linear_matches_reference(device, dtype, bias):
    from pagoda.kernels import linear

    n, k = 96, 80  # neither a multiple of the tiles
    w = torch.randn(n, k).to(device, dtype)
    b = torch.randn(n).to(device, dtype) if bias else None
    for m in (1, 70):
        x = torch.randn(m, k).to(device, dtype)
        want = x.double() @ w.double().T + (b.double() if bias else 0)
        got = linear(x=x, weight=w, bias=b)
        assert got.dtype == dtype and got.shape == (m, n)
        torch.testing.assert_close(got.double(), want, **TOL[dtype])
    assert linear(x=x[:0], weight=w).shape == (0, n)


def test_linear_rejects_bad_input(device):
    from pagoda.kernels import linear

    w = torch.randn(8, 16, device=device)
    with pytest.raises(ValueError, match="expected x"):
        linear(x=torch.randn(2, 15, device=device), weight=w)
    with pytest.raises(ValueError, match="dtypes differ"):
        linear(x=torch.randn(2, 16, device=device).bfloat16(), weight=w)
    with pytest.raises(ValueError, match="bias"):
        linear(x=torch.randn(2, 16, device=device), weight=w, bias=torch.randn(7, device=device))


def _linear_shapes(device: torch.device) -> list[tuple[int, int]]:
    if device.type == "cuda":  # Llama-3.2-1B's qkv, o, gate_up, down and LM head
        return [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (32000, 2048)]
    return [(96, 80), (40, 200)]


def _row_counts(device: torch.device) -> list[int]:
    # decode batches, a CUDA-graph padded size, prefill chunks
    return [1, 3, 64, 255, 256, 264, 2048] if device.type == "cuda" else [1, 2, 5, 67]


@pytest.mark.parametrize("dtype", LINEAR_DTYPES, ids=str)
def test_linear_rows_do_not_depend_on_the_number_of_rows(device, dtype):
    from pagoda.kernels import linear

    counts = _row_counts(device)
    for n, k in _linear_shapes(device):
        w = (torch.randn(n, k) / k**0.5).to(device, dtype)
        x = torch.randn(max(counts), k).to(device, dtype)
        full = linear(x=x, weight=w)
        for m in counts[:-1]:
            part = linear(x=x[-m:], weight=w)  # the last m rows, computed among m rows only
            assert torch.equal(part, full[-m:]), f"[{n}x{k}] rows differ at M={m}"


def _batch(seqs: list[tuple[int, torch.Tensor, list[int]]], device) -> dict:
    """paged_attention arguments for sequences (seq_len, this step's query rows, block table);
    the rows are the last tokens of their sequence."""
    width = max(len(t) for *_, t in seqs)
    qlens = [q.shape[0] for _, q, _ in seqs]
    return {
        "q": torch.cat([q for _, q, _ in seqs]),
        "block_tables": torch.tensor(
            [t + [0] * (width - len(t)) for *_, t in seqs], dtype=torch.int32, device=device
        ),
        "seq_lens": torch.tensor([s for s, *_ in seqs], dtype=torch.int32, device=device),
        "query_start_loc": torch.tensor([0, *qlens], device=device).cumsum(0).to(torch.int32),
        "max_query_len": max(qlens),
        "max_seq_len": max(s for s, *_ in seqs),
    }


@pytest.mark.parametrize(
    ("dtype", "window", "chunk"),
    [(torch.float32, None, None), (torch.bfloat16, None, None), (torch.float32, 37, None),
     (torch.float32, None, 45)],
    ids=["float32", "bfloat16", "float32-window37", "float32-chunk45"],
)  # fmt: skip
@pytest.mark.slow
def test_attention_row_does_not_depend_on_how_it_is_batched(device, dtype, window, chunk):
    """With a sliding window too: a chunk starts reading at its first row's window, a decode at
    its own, and the row's bits stay the same; likewise with an attention chunk (Llama 4: 40
    prefill rows before the last cross a chunk start, so they start reading a chunk earlier)."""
    from pagoda.kernels import paged_attention

    cuda = device.type == "cuda"
    h, hkv, d, bs = (32, 8, 64, 16) if cuda else (6, 2, 32, 16)
    n = 1500 if cuda else 300
    pool = 4 * (n // bs + 1) + 200
    k_cache = torch.randn(pool, bs, hkv, d).to(device, dtype)
    v_cache = torch.randn(pool, bs, hkv, d).to(device, dtype)
    perm = torch.randperm(pool).tolist()
    table, rest = perm[: n // bs + 1], perm[n // bs + 1 :]
    q_all = torch.randn(n, h, d).to(device, dtype)
    scale = d**-0.5

    def q(rows: int) -> torch.Tensor:
        return torch.randn(rows, h, d).to(device, dtype)

    others = [(s, q(1), rest[i * 60 : i * 60 + s // bs + 1]) for i, s in enumerate((900, 3, 47))]
    others.append((64, q(7), rest[180:184]))
    cases = {
        "decode": [(n, q_all[-1:], table)],
        "chunk": [(n, q_all[-40:], table)],
        "fresh prompt": [(n, q_all, table)],
        "beside others": [*others[:3], (n, q_all[-1:], table)],
        "chunk beside others": [*others, (n, q_all[-40:], table)],
    }
    got = {}
    for name, seqs in cases.items():
        batch = _batch(seqs, device)
        out = paged_attention(
            k_cache=k_cache, v_cache=v_cache, scale=scale, batch_invariant=True,
            sliding_window=window, attention_chunk=chunk, **batch,
        )  # fmt: skip
        got[name] = out[-1]
        assert torch.equal(got[name], got["decode"]), name
    ref = reference.paged_attention(
        k_cache=k_cache, v_cache=v_cache, scale=scale, sliding_window=window,
        attention_chunk=chunk, **_batch(cases["decode"], device),
    )  # fmt: skip
    torch.testing.assert_close(got["decode"], ref[-1], **TOL[dtype])
