"""`gguf_dequant`: torch dequantization equals `gguf.quants.dequantize` bit for bit (float32),
and its bf16/fp16 output equals that float32 cast."""

import gguf
import numpy as np
import pytest
import torch
from pagoda.runtime.cpu.quantized import probe_weight
from pagoda.runtime.model import gguf_dequant

Q = gguf.GGMLQuantizationType
QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32")
RANDOM_BLOCKS = ("Q4_K", "Q5_K", "Q6_K", "Q3_K", "IQ4_NL", "IQ4_XS")  # gguf-py cannot quantize
SHAPES = ((3, 256), (2, 3, 512), (1, 256), (5, 768))  # odd rows, stacked (experts)


def reference(data: np.ndarray, kind: str, shape) -> torch.Tensor:
    arr = gguf.quants.dequantize(data, Q[kind]).astype(np.float32, copy=False)
    return torch.from_numpy(np.array(arr.reshape(shape), dtype=np.float32))


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, msg: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, msg
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    assert torch.equal(got.view(ints[got.dtype]), want.view(ints[want.dtype])), msg


def check(data: np.ndarray, kind: str, shape) -> None:
    want = reference(data, kind, shape)
    assert_bits_equal(gguf_dequant.dequantize(data, kind, shape), want, f"{kind} {shape}")
    for dtype in (torch.bfloat16, torch.float16):
        got = gguf_dequant.dequantize(data, kind, shape, dtype, "cpu")
        assert_bits_equal(got, want.to(dtype), f"{kind} {shape} {dtype}")


@pytest.mark.parametrize("kind", QUANTIZABLE)
@pytest.mark.parametrize("shape", SHAPES)
def test_quantized_by_gguf_py_dequantizes_bit_exact(kind, shape):
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 0.1
    data = gguf.quants.quantize(values, Q[kind])
    assert gguf_dequant.covered(kind, shape[-1])
    check(data, kind, shape)


@pytest.mark.parametrize("kind", RANDOM_BLOCKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_random_blocks_dequantize_bit_exact(kind, shape):
    rows = int(np.prod(shape[:-1]))
    blocks = probe_weight(kind, rows, shape[-1], seed=rows).blocks.numpy()  # finite fp16 scales
    assert gguf_dequant.covered(kind, shape[-1])
    check(blocks.reshape(*shape[:-1], -1), kind, shape)


def test_kinds_not_covered_fall_back_to_gguf_py():
    """Q2_K (no torch code here) and a big-endian F32 file keep `gguf.quants`' values."""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (3, 84), dtype=np.uint8)  # Q2_K: 84 bytes per 256 values
    raw[:, 80:84] = np.full((3, 2), 0.01, np.float16).view(np.uint8)  # d, dmin finite
    assert not gguf_dequant.covered("Q2_K", 256)
    check(raw, "Q2_K", (3, 256))
    big = rng.standard_normal((2, 8)).astype(">f4")
    assert_bits_equal(gguf_dequant.dequantize(big, "F32", (2, 8)), reference(big, "F32", (2, 8)),
                      "big-endian F32")  # fmt: skip


def test_results_own_their_memory():
    """A plain F32 tensor is copied out of the (read-only) memory map, not viewed."""
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    data.flags.writeable = False
    out = gguf_dequant.dequantize(data, "F32", (3, 4))
    out += 1  # writable, and the file's bytes are untouched
    assert data[0, 0] == 0 and out[0, 0] == 1


@pytest.mark.parametrize("kind", ("Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "F16"))
def test_dequantizes_on_the_target_device(kind):
    """The raw blocks move to `device` and are dequantized there (meta: shapes and dtypes only,
    the path a CUDA device takes with no host round trip)."""
    blocks = probe_weight(kind, 4, 256).blocks.numpy()
    out = gguf_dequant.dequantize(blocks, kind, (2, 2, 256), torch.bfloat16, torch.device("meta"))
    assert out.device.type == "meta" and out.shape == (2, 2, 256) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("shape", SHAPES)
def test_mxfp4_dequantizes_bit_exact(shape):
    """gpt-oss's MXFP4 (17 bytes per 32 values: an E8M0 exponent, then the nibbles): blocks
    gguf-py quantizes, and random bytes (every exponent, 0, 1 and 255 included: ggml's half
    scale from the exponent's bits, denormal below 2, 2^127 at 255)."""
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    values *= np.exp2(np.random.default_rng(1).integers(-30, 30, (*shape[:-1], 1)))
    assert gguf_dequant.covered("MXFP4", shape[-1]) and not gguf_dequant.covered("MXFP4", 48)
    check(gguf.quants.quantize(values, Q.MXFP4), "MXFP4", shape)
    raw = np.random.default_rng(2).integers(0, 256, (*shape[:-1], shape[-1] // 32 * 17),
                                            dtype=np.uint8)  # fmt: skip
    raw.reshape(-1, 17)[:3, 0] = (0, 1, 255)
    with np.errstate(over="ignore"):  # (gguf-py's float32 product at exponent 255)
        check(raw, "MXFP4", shape)
