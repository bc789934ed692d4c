"""The Mamba2 decode recurrence on the CPU in one pass over the state (`csrc/mamba_step.c`).

Why: a decode step of a Mamba layer reads and writes each sequence's SSM state [heads,
head_dim, d_state] (float32: 128 KiB to 4 MiB a sequence); the torch reference
(`model/mamba2.recurrent_step`) takes three passes over it (decay, input, read-out) and a
gather and a scatter of the slots around them. The C loop updates each slot in place where it
lies (any order of slots) and reads the output in the same pass.

Used for float32 SSM states on the CPU (`Mamba2Mixer._decode`); checked against the torch
reference when it loads (values within 1e-5: the read-out sums in another order);
``PAGODA_CPU_MAMBA=torch`` turns it off; where it cannot be built it logs once and the torch
path runs.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable

import torch
from pagoda.runtime.cpu import build

log = logging.getLogger(__name__)
CSRC = build.CSRC
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
ENV_SWITCH = "PAGODA_CPU_MAMBA"  # "native" (default) or "torch"
Step = Callable[..., torch.Tensor]


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def bind(lib: ctypes.CDLL) -> Step:
    fn = lib.mamba_ssm_step
    fn.restype = None

    def step(state, slots, x, dt, A, B, C, D) -> torch.Tensor:
        """y [S, H, P] float32; `state` [slots, H, P, N] float32 updated in place at `slots`
        (int64 [S]); x [S, H, P], dt [S, H], B and C [S, G, N] (any float dtype: made float32
        and contiguous), A and D [H] float32."""
        S, H, P = x.shape
        N, G = state.shape[-1], B.shape[1]
        args = [a.float().contiguous() for a in (x, dt, A, B, C, D)]
        y = torch.empty(S, H, P, dtype=torch.float32)
        fn(_ptr(state), _ptr(slots), ctypes.c_int64(S), ctypes.c_int64(H), ctypes.c_int64(P),
           ctypes.c_int64(N), ctypes.c_int64(G), *map(_ptr, args), _ptr(y))  # fmt: skip
        return y

    return step


@functools.cache
def load(reference: Callable) -> Step | None:
    """The native step, or None (switched off, no compiler, a failed build or check against
    `reference`, the torch recurrence: `model/mamba2.recurrent_step`, passed in by its caller so
    that this module does not import the model's)."""
    if os.environ.get(ENV_SWITCH, "native") == "torch":
        return None
    compiler = build.find_compiler("CC", ("gcc", "clang", "cc"))
    if compiler is None:
        log.warning("no C compiler: the Mamba decode recurrence runs in torch")
        return None
    try:
        path = build.build(CSRC / "mamba_step.c", name="mamba_step", compiler=compiler,
                           flags=FLAGS)  # fmt: skip
        step = bind(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError) as exc:
        log.warning("the native Mamba step is unavailable, torch runs it: %s", exc)
        return None
    return step if self_check(step, reference) else None


def self_check(step: Step, recurrent_step: Callable) -> bool:
    """The native step against the torch reference on random inputs (slots out of order)."""
    g = torch.Generator().manual_seed(0)
    S, H, P, N, G = 3, 4, 8, 16, 2
    state = torch.randn(5, H, P, N, generator=g)
    slots = torch.tensor([3, 0, 4])
    x, dt = torch.randn(S, H, P, generator=g), torch.rand(S, H, generator=g)
    A, D = -torch.rand(H, generator=g), torch.randn(H, generator=g)
    B, C = torch.randn(S, G, N, generator=g), torch.randn(S, G, N, generator=g)
    want_y, want = recurrent_step(state[slots].clone(), x, dt, A, B, C, D)
    got = state.clone()
    y = step(got, slots, x, dt, A, B, C, D)
    ok = torch.allclose(y, want_y, atol=1e-5, rtol=1e-5)
    ok = ok and torch.allclose(got[slots], want, atol=1e-6, rtol=1e-6)
    ok = ok and torch.equal(got[[1, 2]], state[[1, 2]])  # the other slots untouched
    if not ok:
        log.warning("the native Mamba step disagrees with torch here: torch runs it")
    return ok
