"""The quantized float32 GEMM: it computes x @ W.T for W exactly the dequantized GGUF weight,
gives a row the same bits whatever the row count, its place or the threads, and `Linear` routes
every float32 call to it when the GGUF blocks are at hand (unless PAGODA_CPU_QGEMM=0)."""

from __future__ import annotations

import pytest
import torch
from pagoda.runtime.cpu import qgemm, quantized
from pagoda.runtime.cpu.quantized import BLOCKS
from pagoda.runtime.model.linear import Linear
from pagoda.runtime.sampling.ops import argmax_rows


def _reference(w, x, bias):
    want = x.double() @ w.dequantize().double().T
    return want if bias is None else want + bias.double()


SHAPES = {  # K-quant rows hold whole blocks of 256
    32: [(40, 96), (100, 288), (960, 576), (33, 1536), (16, 32)],
    256: [(40, 256), (100, 768), (33, 1536), (16, 512)],
}


@pytest.mark.parametrize(
    ("kind", "shape"),
    [(kind, shape) for kind in sorted(BLOCKS) for shape in SHAPES[BLOCKS[kind][0]]],
)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 7, 97, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64(kernel, kind, shape, rows, bias):
    n, k = shape
    g = torch.Generator().manual_seed(rows + n)
    w = qgemm.probe_weight(kind, n, k, seed=rows)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(rows, k, generator=g)
    got = kernel.bind(w, b)(x)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    want = _reference(w, x, b)
    # float32 sums of k products: error grows like sqrt(k) * eps * |terms|
    # float32 sums of k terms: off by at most ~k * 2^-24 of the terms' absolute sum
    dense = w.dequantize().double()
    tol = 1.2 * k * 2**-24 * (x.double().abs() @ dense.abs().T + (0 if b is None else b.abs()))
    assert ((got.double() - want).abs() <= tol + 1e-6).all()


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_a_row_has_the_same_bits_for_every_row_count_place_and_thread_count(kernel, kind):
    n, k = 200, 1536  # several key chunks; N not a multiple of the 16-output units
    w = qgemm.probe_weight(kind, n, k, seed=3)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(4))
    bound = kernel.bind(w, bias)
    x = torch.randn(230, k, generator=torch.Generator().manual_seed(5))
    full = bound(x)
    for m in (1, 2, 3, 5, 6, 13, 97, 101):
        for start in (0, 7, 230 - m):
            assert torch.equal(bound(x[start : start + m]), full[start : start + m]), (m, start)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(bound(x), full)
        assert torch.equal(bound(x[:1]), full[:1])
    finally:
        torch.set_num_threads(threads)


def test_parts_of_other_kinds_write_their_own_columns(kernel):
    parts = [qgemm.probe_weight(k, n, 512, seed=i) for i, (k, n) in
             enumerate([("Q4_K", 48), ("Q6_K", 16), ("Q8_0", 40)])]  # fmt: skip
    bias = torch.randn(104)
    x = torch.randn(9, 512)
    got = kernel.bind(parts, bias)(x)
    row0 = 0
    for p in parts:
        want = kernel.bind(p, bias[row0 : row0 + p.rows])(x)
        assert torch.equal(got[:, row0 : row0 + p.rows], want), p.kind
        row0 += p.rows
    with pytest.raises(ValueError, match="columns"):
        kernel.bind([parts[0], qgemm.probe_weight("Q4_K", 16, 256)], None)


def test_strided_rows_and_empty_batches(kernel):
    w = qgemm.probe_weight("Q4_1", 48, 64)
    bound = kernel.bind(w, None)
    x = torch.randn(5, 128)[:, ::2]  # not unit stride: copied
    assert torch.equal(bound(x), bound(x.contiguous()))
    assert bound(torch.empty(0, 64)).shape == (0, 48)
    with pytest.raises(ValueError, match=r"float32 \[M, 64\]"):
        bound(torch.randn(2, 32))


@pytest.mark.parametrize("kind", sorted(BLOCKS))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 97, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_argmax_is_the_first_maximum_of_the_outputs_it_never_stores(kernel, kind, rows, bias):
    n, k = 1000, 512  # 63 output blocks, the last one partial
    g = torch.Generator().manual_seed(rows)
    w = qgemm.probe_weight(kind, n, k, seed=rows)
    b = torch.randn(n, generator=g) if bias else None
    bound = kernel.bind(w, b)
    x = torch.randn(rows, k, generator=g)
    y = bound(x)
    assert torch.equal(bound.argmax(x), y.argmax(-1))
    assert torch.equal(bound.argmax(x), argmax_rows(y))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(bound.argmax(x), y.argmax(-1))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [1, 2, 4, 7, 200])
def test_argmax_ties_go_to_the_first_column_and_nan_never_wins(kernel, rows):
    dense = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0))
    top = dense.abs().max() * 4
    for col in (9, 700, 999, 31):  # equal best outputs in blocks far apart (other tasks)
        dense[col] = top
    w = quantized.from_dense(dense.to(torch.bfloat16))
    bound = kernel.bind(w, None)
    x = torch.rand(rows, 64, generator=torch.Generator().manual_seed(1)) + 0.5
    for _ in range(5):  # the threads claim blocks in varying orders
        assert (bound.argmax(x) == 9).all()
    x[0, 3] = float("nan")  # every output of row 0 is NaN: no token (-1), as argmax_rows
    assert bound.argmax(x)[0] == -1 == argmax_rows(bound(x))[0]
    assert (bound.argmax(x)[1:] == 9).all()


def test_argmax_takes_one_part_and_any_batch(kernel):
    w = qgemm.probe_weight("Q4_0", 48, 64)
    bound = kernel.bind(w, None)
    x = torch.randn(5, 128)[:, ::2]
    assert torch.equal(bound.argmax(x), bound(x).argmax(-1))
    assert bound.argmax(torch.empty(0, 64)).shape == (0,)
    with pytest.raises(ValueError, match="one part"):
        kernel.bind([w, w], None).argmax(x)
    lin = Linear(w.dequantize(), quantized=w)
    assert lin.fuses_sampling and torch.equal(lin.argmax(x), bound.argmax(x))
    plain = Linear(w.dequantize())  # oneDNN: the outputs, then their argmax
    assert not plain.fuses_sampling and torch.equal(plain.argmax(x), plain(x).argmax(-1))


def test_linear_takes_the_blocks_for_float32_only(kernel, monkeypatch):
    w = qgemm.probe_weight("Q8_0", 64, 96)
    dense = w.dequantize()
    lin = Linear(dense, quantized=w)
    assert isinstance(lin.fast, qgemm.QGemmWeight) and lin.weight is None and lin.packed is None
    x = torch.randn(4, 96)
    assert torch.allclose(lin(x), x @ dense.T, rtol=1e-5, atol=1e-5)
    assert lin(x[:1]).shape == (1, 64)
    assert not isinstance(Linear(dense.to(torch.bfloat16), quantized=w).fast, qgemm.QGemmWeight)
    assert not isinstance(Linear(dense[:32], quantized=w).fast, qgemm.QGemmWeight)  # wrong shape
    monkeypatch.setenv(qgemm.ENV_SWITCH, "0")
    assert not isinstance(Linear(dense, quantized=w).fast, qgemm.QGemmWeight)
    monkeypatch.setenv(qgemm.ENV_SWITCH, "yes")
    with pytest.raises(ValueError, match="PAGODA_CPU_QGEMM"):
        Linear(dense, quantized=w)


def test_the_embedded_model_runs_on_the_blocks_in_float32(kernel):
    from pagoda.runtime import LLM, SamplingParams

    llm = LLM("smollm2-135m", dtype="float32", kv_cache_memory=16 << 20)
    model = llm.engine.runner.model
    linears = model.linears()
    assert len(linears) == 4 * len(model.layers) + 1
    assert all(isinstance(x.fast, qgemm.QGemmWeight) for x in linears)
    assert model.lm_head.fast.kinds == ("Q8_0",)
    assert all(x.fast.kinds == ("Q4_1",) for x in linears[:-1])  # q/k/v and gate/up as one
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids
    batch = ["The capital of France is", "Write a haiku about autumn leaves falling"] * 3
    outs = llm.generate(batch, params)
    assert all(o.outputs[0].token_ids == alone for o in outs[::2])  # batch-invariant


def test_the_load_time_check_refuses_a_kernel_that_is_off(kernel):
    class LoneRowOff:  # right through the buffer, wrong in registers (one row)
        def bind(self, w, bias):
            real = kernel.bind(w, bias)
            return lambda x: real(x) * (1.001 if x.shape[0] == 1 else 1.0)

    assert qgemm._agrees(kernel)
    assert not qgemm._agrees(LoneRowOff())


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_row_lookups_are_the_dequantized_rows(kernel, kind):
    """An embedding table read from the units: `F.embedding` over the dequantized weight,
    bit for bit, any ids (repeated, the padded last block's rows), out-of-range ids refused."""
    k = BLOCKS[kind][0] * 2
    w = qgemm.probe_weight(kind, 40, k, seed=2)  # 3 blocks of 16 rows, the last one partial
    bound = kernel.bind(w, None)
    ids = torch.tensor([0, 39, 17, 17, 32, 5])
    assert torch.equal(bound.rows(ids), torch.nn.functional.embedding(ids, w.dequantize()))
    assert bound.rows(torch.empty(0, dtype=torch.long)).shape == (0, k)
    for bad in (40, -1):
        with pytest.raises(IndexError, match="out of range"):
            bound.rows(torch.tensor([3, bad]))
