"""A bf16 GEMM on AMX tiles whose rows do not depend on the number of rows, over oneDNN's packed
weights (read in place).

oneDNN's AMX GEMM (``brg_matmul:avx10_1_512_amx``) picks its blocking, and with it the rounding
of a row, by the number of rows M, so in bf16 a sequence's greedy tokens could depend on what it
was batched with (docs/runtime.md, "What is guaranteed"). Here every output is one float32
accumulator updated by ``tdpbf16ps`` over the K-blocks of 32 inputs in increasing order, then
rounded once to bf16 (RNE, bias added in float32 first). AMX computes every row of a tile on its
own, tasks never split K, and the last tile of a call is configured with fewer rows instead of
padding: a row's bits are the same for every M, every thread count and every neighbour.

The weights are the ``AB16b32a2b`` copy `Linear` packs for oneDNN (see `gemv.probe_layout`): a
block of 32 outputs by 32 inputs is [16 pairs][32 outputs][2], i.e. two B tiles side by side in
rows of 128 bytes. A task is an (M-chunk of up to 32 rows, N-block of 32 outputs) pair: 2 A tiles
x 2 B tiles -> 4 C tiles, whose rows are rounded and stored while the next task multiplies.
Tasks run M-chunks inner within bands of 512 rows, so a weight block comes from memory once per
band (fetched ahead by the band's first chunk) and the band's rows stay in L2; the threads of
``csrc/pool.h`` claim them. Outputs of 1 MiB or more are stored around the caches.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
from pagoda.runtime.cpu import build, gemv

log = logging.getLogger(__name__)

NB = 32  # outputs per packed block: the layout the tiles read
AMX_SWITCH = "PAGODA_CPU_AMX"  # "0": none of Pagoda's AMX code (this GEMM, the attention tiles)
ENV_SWITCH = "PAGODA_CPU_AMX_GEMM"  # "0": this GEMM only (bf16 matmuls back on oneDNN)
SERIAL_BELOW = 1 << 18  # multiply-adds below which the calling thread works alone
STREAM_FROM = 1 << 20  # output bytes from which rows are stored around the caches


class AmxGemm:
    """The compiled GEMM (see the module docstring); `bind` one packed weight to call it."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.pagoda_amx_gemm_bf16.argtypes = [p, p, i64, p, i64, p, i32, i32, i32, i32, i32]
        lib.pagoda_amx_gemm_bf16.restype = i32
        self.fn = lib.pagoda_amx_gemm_bf16

    def accepts(self, packed: torch.Tensor, n: int, k: int) -> bool:
        """Whether a packed weight has the layout this GEMM reads (its size says so)."""
        return torch.ops.mkldnn._nbytes(packed) == gemv.packed_nbytes(n, k, NB)

    def bind(self, packed: torch.Tensor, bias: torch.Tensor | None) -> AmxWeight:
        return AmxWeight(self, packed, bias)


class AmxWeight(gemv.PackedWeight):
    __slots__ = ()

    def __init__(self, gemm: AmxGemm, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(gemm.fn, packed, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16, each row's bits independent of M."""
        m = x.shape[0]
        y = torch.empty(m, self.n, dtype=torch.bfloat16)
        if m == 0:
            return y
        if x.stride(1) != 1 or x.stride(0) < self.k:
            x = x.contiguous()
        # a helper thread costs ~20-50 us to wake: worth it from ~0.25 M multiply-adds
        threads = torch.get_num_threads() if m * self.n * self.k >= SERIAL_BELOW else 1
        args = (self.ptr, x.data_ptr(), x.stride(0), y.data_ptr(), self.n, self.bias_ptr)
        stream = int(m * self.n * 2 >= STREAM_FROM)
        rc = self.fn(*args, m, self.n, self.k, stream, threads)
        if rc:
            raise RuntimeError(f"AMX GEMM failed (code {rc}) for {m}x{self.k} @ {self.n}x{self.k}")
        return y


@functools.cache
def load(pack) -> AmxGemm | None:
    """The GEMM for weights packed by `pack`, or None: no compiler, no AMX (or tile state not
    granted, or ``PAGODA_CPU_AMX=0`` / ``PAGODA_CPU_AMX_GEMM=0``), oneDNN's layout is not ``AB16b32a2b``, or it disagrees
    with oneDNN on a probe."""
    off = os.environ.get(AMX_SWITCH) == "0" or os.environ.get(ENV_SWITCH) == "0"
    if "amx_bf16" not in build.cpu_signature() or off:
        return None
    compiler = build.find_compiler("CXX", ("g++", "clang++"))
    if compiler is None:
        return None
    try:
        path = gemv.compile_kernel("amx_gemm", compiler)
        if gemv.probe_layout(pack) != NB:
            log.info("AMX GEMM off: oneDNN's packed bf16 layout is not AB16b32a2b")
            return None
        gemm = AmxGemm(ctypes.CDLL(str(path)))
        return gemm if gemv.agrees_with_onednn(gemm, pack, 40, "AMX GEMM") else None
    except (OSError, RuntimeError, AttributeError) as exc:
        log.warning("AMX GEMM unavailable: %s", exc)
        return None
