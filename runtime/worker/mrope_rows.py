"""Qwen2-VL's M-RoPE positions for a step (`model/qwen2_vl.py`), on the host.

Each request's prompt positions ([3, L]) and delta were computed once at intake
(`multimodal/qwen2_vl_inputs.build`). A token past the prompt (generated, or recomputed after
preemption) sits at position + delta on all three axes, as do a text-only request's tokens
(delta 0): those need no [3, T] rows, the ordinary rotary at the shifted position is the same.
Only a step holding prompt rows of a request with images carries the [3, T] array, filled
with one slice per such request (never a loop per token).
"""

from __future__ import annotations

import numpy as np
from pagoda.runtime.request import Request


def prepare(reqs: list[Request], starts: np.ndarray, qlens: np.ndarray, cu: np.ndarray,
            positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """(the rotary's positions [T]: the cache positions shifted by each request's delta, and
    the [3, T] positions where the step holds a prompt row of a request with images, else
    None). The cache positions (slots) are left as they are."""
    mms = [r.params.multi_modal for r in reqs]
    delta = np.fromiter((0 if m is None else m.mrope_delta for m in mms), np.int64, len(reqs))
    shifted = positions + np.repeat(delta, qlens) if delta.any() else positions
    prompt_lens = np.fromiter((0 if m is None or m.mrope is None else m.mrope.shape[1] for m in mms),
                              np.int64, len(reqs))  # fmt: skip
    rows = np.flatnonzero(starts < prompt_lens)
    if len(rows) == 0:
        return shifted, None
    out = np.repeat(shifted[None], 3, axis=0)
    for i in rows.tolist():
        st, a = int(starts[i]), int(cu[i])
        k = min(int(qlens[i]), int(prompt_lens[i]) - st)
        out[:, a : a + k] = mms[i].mrope[:, st : st + k]
    return shifted, out
