"""The native CPU ops give the bits `pagoda.runtime.model.ops` gives (any NaN matching any NaN)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from pagoda.runtime.cpu import ops as cpu_ops
from pagoda.runtime.cpu.ops import same_bits, self_check
from pagoda.runtime.model import ops

DTYPES = (torch.bfloat16, torch.float32)
ROWS = (1, 3, 70, 300)
EDGES = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-41, 3e38, -3e38, 1e-3]


@pytest.fixture(scope="module")
def native() -> cpu_ops.NativeOps:
    result = cpu_ops._native_ops(ops.TORCH_OPS)
    if result is None:
        pytest.skip("the native CPU ops library cannot be built here")
    return result


def values(shape, dtype, seed: int, edges: bool, scale: float = 3.0) -> torch.Tensor:
    """Random normals, with edge values (zeros, infinities, NaN, subnormals, huge) sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    if edges:
        pick = torch.randint(0, len(EDGES) * 4, shape, generator=g)
        table = torch.tensor(EDGES + [float("nan")] * (len(EDGES) * 3))
        x = torch.where(pick < len(EDGES), table[pick.clamp(max=len(EDGES) - 1)], x)
    return x.to(dtype)


def test_same_bits_is_strict():
    a = torch.tensor([1.0, 0.0, float("nan")])
    assert same_bits(a, a.clone())
    assert not same_bits(a, torch.tensor([1.0, -0.0, float("nan")]))  # sign of zero counts
    assert not same_bits(a, torch.tensor([1.0, 0.0, 1.0]))
    assert not same_bits(a, a.to(torch.bfloat16))


def test_enabled_on_x86_capabilities(native):
    expected = {("silu_and_mul", torch.bfloat16)}
    expected |= {(op, dt) for op in ("rotary_embedding",) for dt in DTYPES}
    if torch.backends.cpu.get_cpu_capability() in cpu_ops.LANES:
        expected |= {("rms_norm", dt) for dt in DTYPES}
    if torch.backends.cpu.get_cpu_capability() in cpu_ops.SILU_BLOCK:
        expected.add(("silu_and_mul", torch.float32))
    assert native.enabled == expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", ROWS)
@pytest.mark.parametrize("edges", [False, True])
def test_silu_and_mul(native, dtype, t, edges):
    x = values((t, 2 * 1536 + 2 * 37), dtype, seed=t, edges=edges)  # I = 1573: a scalar tail
    x1, x2 = x.clone(), x.clone()
    out = native.silu_and_mul(x=x1)
    assert same_bits(out, ops.silu_and_mul(x=x2))
    assert same_bits(x1, x2)  # the gate half is overwritten with silu, as torch's in-place silu


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(1, 1573), (3, 1536), (21, 1573), (71, 509), (300, 1536)])
def test_silu_and_mul_float32_thread_splits(native, threads, shape):
    """float32 silu follows ATen's vector and scalar paths, which depend on how its threads
    split the rows (the scalar tail of each piece); the gate half too."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = values((shape[0], 2 * shape[1]), torch.float32, seed=shape[0], edges=True, scale=20.0)
        x1, x2 = x.clone(), x.clone()
        assert same_bits(native.silu_and_mul(x=x1), ops.silu_and_mul(x=x2))
        assert same_bits(x1, x2)
    finally:
        torch.set_num_threads(before)


def test_silu_and_mul_every_bf16_gate(native):
    """All 65,536 bf16 patterns as gates, over a strided [T, 2I] view."""
    gate = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    up = values((1 << 16,), torch.bfloat16, seed=5, edges=False)
    buf = torch.zeros(4, 3 << 14, dtype=torch.bfloat16)
    buf[:, : 1 << 14], buf[:, 1 << 14 : 2 << 14] = gate.view(4, -1), up.view(4, -1)
    a, b = buf.clone()[:, : 2 << 14], buf.clone()[:, : 2 << 14]
    assert not a.is_contiguous()
    assert same_bits(native.silu_and_mul(x=a), ops.silu_and_mul(x=b))
    assert same_bits(a, b)


def _qkv(t, h, hk, d, dtype, seed, edges):
    qkv = values((t, (h + 2 * hk) * d), dtype, seed=seed, edges=edges)
    cs = values((t, d), dtype, seed=seed + 1, edges=edges, scale=1.0)
    return qkv, cs


def _split(qkv, h, hk, d):
    """q and k as the model makes them: split the fused output, then reshape."""
    t = qkv.shape[0]
    q, k, _ = qkv.split([h * d, hk * d, hk * d], dim=-1)
    return q.reshape(t, h, d), k.reshape(t, hk, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", ROWS)
@pytest.mark.parametrize("edges", [False, True])
def test_rotary_joint_qkv(native, dtype, t, edges):
    h, hk, d = 9, 3, 64
    qkv, cs = _qkv(t, h, hk, d, dtype, seed=t, edges=edges)
    a, b = qkv.clone(), qkv.clone()
    qa, ka = _split(a, h, hk, d)
    assert t == 1 or ops._joint_view(qa, ka) is not None
    native.rotary_embedding(positions=None, q=qa, k=ka, cos_sin_cache=cs)
    ops.rotary_embedding(positions=None, q=_split(b, h, hk, d)[0], k=_split(b, h, hk, d)[1],
                         cos_sin_cache=cs)  # fmt: skip
    assert same_bits(a, b)
    assert not same_bits(a, qkv)  # it did rotate


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", (1, 70))
def test_rotary_separate_q_k_and_positions(native, dtype, t):
    h, hk, d = 4, 2, 32
    q = values((t, h, d), dtype, seed=1, edges=False)
    k = values((t, hk, 2 * d), dtype, seed=2, edges=False)[:, :, :d]  # not adjacent to q
    cache = ops.build_cos_sin_cache(d, 10000.0, None, 512)
    pos = torch.randint(0, 512, (t,))
    qa, ka, qb, kb = q.clone(), k.clone(), q.clone(), k.clone()
    assert ops._joint_view(qa, ka) is None
    native.rotary_embedding(positions=pos, q=qa, k=ka, cos_sin_cache=cache)
    ops.rotary_embedding(positions=pos, q=qb, k=kb, cos_sin_cache=cache)
    assert same_bits(qa, qb) and same_bits(ka, kb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", ROWS)
@pytest.mark.parametrize("width", (64, 100, 576, 2048))
@pytest.mark.parametrize("edges", [False, True])
def test_rms_norm(native, dtype, t, width, edges):
    x = values((t, width), dtype, seed=t + width, edges=edges)
    w = values((width,), dtype, seed=7, edges=False, scale=0.3) + 1
    assert same_bits(
        native.rms_norm(x=x, weight=w, eps=1e-5), ops.rms_norm(x=x, weight=w, eps=1e-5)
    )
    r = values((t, width), dtype, seed=t + 1, edges=edges)
    ra, rb = r.clone(), r.clone()
    oa, ra_out = native.rms_norm(x=x, weight=w, eps=1e-6, residual=ra)
    ob, _ = ops.rms_norm(x=x, weight=w, eps=1e-6, residual=rb)
    assert ra_out is ra
    assert same_bits(oa, ob) and same_bits(ra, rb)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_magnitudes(native, dtype):
    """Rows from 1e-3 to 1e3; in float32 any change of summation order shows."""
    g = torch.Generator().manual_seed(3)
    for width in (64, 576, 960, 4096):
        x = torch.randn(400, width, generator=g) * 10 ** (torch.rand(400, 1, generator=g) * 6 - 3)
        x, w = x.to(dtype), torch.randn(width, generator=g).to(dtype)
        assert same_bits(
            native.rms_norm(x=x, weight=w, eps=1e-5), ops.rms_norm(x=x, weight=w, eps=1e-5)
        )


def test_rms_norm_strided_rows(native):
    x = values((5, 1024), torch.bfloat16, seed=9, edges=False)[:, :576]
    w = values((576,), torch.bfloat16, seed=8, edges=False)
    assert same_bits(
        native.rms_norm(x=x, weight=w, eps=1e-5), ops.rms_norm(x=x, weight=w, eps=1e-5)
    )


def test_self_check_catches_a_wrong_op(native):
    assert self_check(native) == set()
    broken = cpu_ops.NativeOps(
        native.lib, ops.TORCH_OPS, 16
    )  # the sum order of AVX-512 lanes: not ATen's
    broken.table[0x3F80] = 0.5  # silu(1.0) made wrong (the table is the instance's own)
    failed = self_check(broken)
    assert ("silu_and_mul", torch.bfloat16) in failed
    assert ("rms_norm", torch.float32) in failed


def test_ctypes_fallback(native):
    """Without Python.h the same C functions are called through ctypes."""
    lib = cpu_ops.load_library(extension=False)
    assert lib is not native.lib
    through_ctypes = cpu_ops.NativeOps(lib, ops.TORCH_OPS, native.lanes, native.silu_block)
    assert self_check(through_ctypes) == set()
    x, w = values((3, 576), torch.bfloat16, 1, True), values((576,), torch.bfloat16, 2, False)
    out = through_ctypes.rms_norm(x=x, weight=w, eps=1e-5)
    assert same_bits(out, ops.rms_norm(x=x, weight=w, eps=1e-5))


def test_switch(monkeypatch, native):
    monkeypatch.setenv(cpu_ops.ENV_SWITCH, "torch")
    assert cpu_ops.cpu_ops(ops.TORCH_OPS) is None
    monkeypatch.setenv(cpu_ops.ENV_SWITCH, "native")
    got = cpu_ops.cpu_ops(ops.TORCH_OPS)
    assert got is not None and got.pregather_rotary
    assert got.rms_norm.__self__ is native
    monkeypatch.setenv(cpu_ops.ENV_SWITCH, "fast")
    with pytest.raises(ValueError):
        cpu_ops.cpu_ops(ops.TORCH_OPS)


class CountingLib:
    """The library's entry points, counting calls."""

    def __init__(self, lib) -> None:
        self.lib, self.calls = lib, Counter()

    def __getattr__(self, name: str):
        fn = getattr(self.lib, name)

        def call(*args):
            self.calls[name] += 1
            return fn(*args)

        return call


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_model_logits_unchanged(tmp_path, monkeypatch, native, dtype):
    """A tiny Llama's logits at every prefill and decode step, bit for bit, with either set."""
    pytest.importorskip("transformers")
    from hf_oracle import make_tiny_llama
    from pagoda.runtime import LLM, SamplingParams
    from pagoda.runtime.model.loader import load_model
    from pagoda.runtime.worker import model_build

    make_tiny_llama(tmp_path)
    prompts = [[(7 * i + 3) % 300 for i in range(n)] for n in (5, 150)]
    counting = CountingLib(native.lib)
    runs = []
    for chosen in (
        ops.TORCH_OPS,
        cpu_ops.NativeOps(counting, ops.TORCH_OPS, native.lanes, native.silu_block).as_ops(),
    ):
        monkeypatch.setattr(model_build, "select_ops", lambda device, name, c=chosen: c)
        llm = LLM(loaded=load_model(str(tmp_path)), dtype=dtype, kv_cache_memory=8 << 20,
                  max_num_batched_tokens=128)  # fmt: skip
        assert llm.engine.runner.model.ops is chosen
        seen: dict[str, list[torch.Tensor]] = {}
        llm.engine.runner.logits_hook = lambda reqs, lg, seen=seen: [
            seen.setdefault(r.request_id, []).append(row.clone())
            for r, row in zip(reqs, lg.float())
        ]
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
        )
        runs.append(([o.outputs[0].token_ids for o in outs], [seen[o.request_id] for o in outs]))
    silu = "pagoda_silu_mul_bf16" if dtype == "bfloat16" else "pagoda_silu_mul_f32"
    entry = {"rms_norm": "pagoda_rms_norm", "rotary_embedding": "pagoda_rope", "silu_and_mul": silu}
    dt = getattr(torch, dtype)
    expected = {entry[op] for op, d in native.enabled if d == dt}
    assert set(counting.calls) == expected  # the native code did run
    (tokens_a, logits_a), (tokens_b, logits_b) = runs
    assert tokens_a == tokens_b
    for rows_a, rows_b in zip(logits_a, logits_b):
        assert len(rows_a) == len(rows_b) == 8
        assert all(same_bits(a, b) for a, b in zip(rows_a, rows_b))
