"""The native C sampler kernels: built here, argmax as torch's, edge rows never yield an invalid
token, rows split over threads draw the same tokens, and a missing compiler falls back cleanly.
(Their sampled distribution is tested by chi-square in test_sampler_distribution.py.)"""

from __future__ import annotations

import shutil

import pytest
import torch
from pagoda.runtime.sampling import native, ops

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler"
)


def test_kernels_build_and_load_with_the_system_compiler():
    assert native.available()
    assert native.usable(torch.zeros(2, 3))
    assert not native.usable(torch.zeros(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [5, 128, 300, 1000, 2047, 2048, 2049, 4160, 32000])
def test_argmax_matches_torch_including_ties_and_inf(vocab, dtype):
    torch.manual_seed(0)
    x = torch.randn(16, vocab)
    x[0] = 0.0  # all tied: the first index wins
    x[1, 2] = x[1, -1] = 100.0  # tie across chunks
    x[2, -1] = 100.0  # maximum in the tail
    x[3] = float("-inf")
    x[4, 1] = float("inf")
    x[5, vocab // 2 :] = 50.0  # ties from the middle on
    x[6, -min(vocab, 70) :] = 60.0  # ties in the last vector and the scalar tail
    x[7, vocab // 3] = -0.0  # -0 and +0 tie
    x[7, vocab // 3 + 1 :] = 0.0
    x[7, : vocab // 3] = -1.0
    x[8] = -3.0e38  # huge negative, finite
    x[8, vocab - 1] = -2.0e38
    x = x.to(dtype)
    want = x.float().argmax(-1)
    want[3] = want[4] = -1  # no finite maximum (all -inf; +inf): no token
    assert native.argmax_rows(x).tolist() == want.tolist()


def test_sample_rows_edge_rows_yield_valid_tokens():
    v = 300
    x = torch.randn(6, v)
    x[0] = float("-inf")  # no finite maximum: no token (-1)
    x[1, 7] = float("inf")  # an infinite logit (an overflow): no token either
    x[2, :] = float("-inf")
    x[2, 299] = 0.0  # a single finite token, in the tail
    x[3, :] = -1e30  # huge but finite: all weights equal
    x[4, 123] = 50.0  # T = 0.01 below: every other weight underflows to zero
    inv_t = torch.tensor([1.0, 1.0, 1.0, 1.0, 100.0, 0.01])
    u = torch.tensor([0.5, 0.5, 0.9999999, 0.9999999, 0.0, 0.9999999])
    tokens = native.sample_rows(x, inv_t, None, u).tolist()
    assert tokens[:3] == [-1, -1, 299]
    assert all(0 <= t < v for t in tokens[2:])
    assert tokens[4] == 123


def test_min_p_drops_tokens_below_the_threshold():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * 296]))
    u = torch.linspace(0, 0.999, 200)
    xs = x.expand(200, -1).contiguous()
    tokens = native.sample_rows(xs, torch.ones(200), torch.full((200,), 0.5), u)
    assert set(tokens.tolist()) == {0, 1}  # 0.3 >= 0.5 * 0.5; 0.15 is not


def test_rows_split_over_threads_draw_the_same_tokens():
    torch.manual_seed(1)
    x, u = torch.randn(64, 1000) * 3, torch.rand(64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.sample_rows(x, torch.full((64,), 1.5), None, u)
        torch.set_num_threads(4)
        four = native.sample_rows(x, torch.full((64,), 1.5), None, u)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, four)


def test_native_and_torch_paths_pick_the_same_tokens_up_to_rounding():
    torch.manual_seed(2)
    x, u = torch.randn(128, 1000) * 2, torch.rand(128)
    inv_t = torch.full((128,), 1 / 0.7)
    kernel = native.sample_rows(x, inv_t, None, u)
    fallback = ops.sample_weights(ops.exp_weights(x, inv_t, x.amax(-1, True)), u)
    assert (kernel == fallback).float().mean() > 0.95  # differ only where u hits a boundary


def test_missing_compiler_falls_back_to_torch(monkeypatch, tmp_path):
    monkeypatch.setenv("PAGODA_CACHE_DIR", str(tmp_path))  # no cached build to reuse
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    native._library.cache_clear()
    try:
        assert not native.available()
        assert not native.usable(torch.zeros(2, 300))
        x = torch.randn(4, 300)
        assert ops.argmax_rows(x).tolist() == x.argmax(-1).tolist()
    finally:
        native._library.cache_clear()


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("PAGODA_NATIVE_SAMPLER", "0")
    native._library.cache_clear()
    try:
        assert not native.available()
    finally:
        native._library.cache_clear()


@pytest.mark.parametrize(
    "temperature, filters", [(0.0, {}), (0.7, {}), (0.7, {"top_p": 0.9}), (0.7, {"top_k": 40})]
)
def test_bfloat16_logits_draw_the_tokens_of_their_float32_widening(temperature, filters):
    from pagoda.runtime.request import Request
    from pagoda.runtime.sampling.params import SamplingParams
    from pagoda.runtime.sampling.sampler import SamplingBatch, sample

    torch.manual_seed(3)
    logits = (torch.randn(40, 1000) * 3).bfloat16()
    params = [SamplingParams(temperature=temperature, seed=i, **filters) for i in range(40)]

    def run(x: torch.Tensor) -> list[int]:
        reqs = [Request(f"r{i}", [1], p) for i, p in enumerate(params)]
        for r in reqs:
            r.generator = torch.Generator().manual_seed(r.params.seed)
        return sample(x, SamplingBatch.build(reqs, 1000, torch.device("cpu"))).token_ids.tolist()

    assert run(logits) == run(logits.float())
    assert native.usable(logits)


def test_bfloat16_logits_with_logprobs_are_widened_first():
    from pagoda.runtime.request import Request
    from pagoda.runtime.sampling.params import SamplingParams
    from pagoda.runtime.sampling.sampler import SamplingBatch, sample

    logits = torch.randn(3, 300).bfloat16()
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=0, logprobs=2)) for i in range(3)]
    out = sample(logits, SamplingBatch.build(reqs, 300, torch.device("cpu")))
    assert out.logprobs.dtype == torch.float32
    assert out.token_ids.tolist() == logits.float().argmax(-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_portable_build_argmax_matches_torch(tmp_path, dtype):
    """Without -march=native (no AVX-512 intrinsics) the plain C argmax gives the same tokens."""
    import ctypes

    from pagoda.runtime.cpu import build

    cc = build.find_compiler("CC", ["cc", "gcc"])
    path = build.build(
        native.SOURCE, name="sampler_portable", compiler=cc, flags=native.FLAGS, directory=tmp_path
    )
    lib = ctypes.CDLL(str(path))
    torch.manual_seed(1)
    x = torch.randn(8, 2049)
    x[1, 5] = x[1, 2000] = 9.0
    x[2] = float("-inf")
    x = x.to(dtype)
    out = torch.empty(8, dtype=torch.long)
    counter = ctypes.c_int64(0)
    bf16 = int(dtype == torch.bfloat16)
    args = (ctypes.c_void_p(x.data_ptr()), bf16, ctypes.c_int64(2049))
    lib.argmax_rows(*args, ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(8),
                    ctypes.byref(counter), ctypes.c_int64(8))  # fmt: skip
    want = x.float().argmax(-1)
    want[2] = -1  # no finite maximum: no token
    assert out.tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chosen_rows_are_read_in_place_with_the_tokens_of_a_copy(dtype):
    """`rows`: a mixed batch's subsets are sampled without copying their [n, vocab] logits,
    and each row gets the token it would get from a copy of just those rows."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(40, 3000, generator=g) * 3).to(dtype)
    rows = torch.tensor([0, 3, 4, 17, 39])
    n = len(rows)
    inv_t, u = torch.full((n,), 1.3), torch.rand(n, generator=g)
    min_p, top_p = torch.full((n,), 0.05), torch.full((n,), 0.8)
    top_k = torch.tensor([5, 3000, 40, 1, 3000])
    want = native.sample_rows(x[rows], inv_t, min_p, u)
    assert torch.equal(native.sample_rows(x, inv_t, min_p, u, rows), want)
    want = native.sample_filtered_rows(x[rows], inv_t, top_k, top_p, None, u)
    got = native.sample_filtered_rows(x, inv_t, top_k, top_p, None, u, rows)
    assert torch.equal(got, want)
    empty = torch.empty(0, dtype=torch.long)
    assert native.sample_rows(x, inv_t[:0], None, u[:0], empty).shape == (0,)
    with pytest.raises(IndexError, match="out of range"):
        native.sample_rows(x, inv_t[:1], None, u[:1], torch.tensor([40]))
    with pytest.raises(ValueError, match="int64"):
        native.sample_rows(x, inv_t[:1], None, u[:1], torch.tensor([1], dtype=torch.int32))
