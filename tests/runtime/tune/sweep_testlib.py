"""What the kernel-sweep tests share: the device they sweep on (CUDA, else the Triton
interpreter on the CPU), its timer, and one bucket swept by `tune_kernels` into a folder of tuned
configs that the kernels' lookups then read."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from pagoda.kernels import config as kc
from pagoda.runtime.tune import sweep

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
DEVICE = torch.device("cuda" if os.environ["TRITON_INTERPRET"] == "0" else "cpu")
timer = sweep.cuda_graph_timer if DEVICE.type == "cuda" else sweep.wall_timer


def tune_one(
    bucket: Any,
    space: Callable[[str], list[dict]],
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    good: dict,
    candidates: int,
    rejected: int,
) -> dict:
    """`bucket` alone through `tune_kernels` with `space`'s candidates (and the packaged default
    first, its baseline), saved for "Test GPU" in `out`; then `out` is the tuned-config folder
    the lookups read (the caller clears the config cache when done). Checks that the sweep
    completed, tried `candidates`, rejected `rejected`, chose `good` or the baseline and saved
    the winner for the bucket's shape; returns the bucket's report."""
    monkeypatch.delenv(kc.CONFIG_DIR_ENV, raising=False)
    kc.clear_config_cache()
    reports, complete = sweep.tune_kernels(
        None, [bucket], device=DEVICE, device_label="Test GPU", out_dir=out, timer=timer,
        space=space,
    )  # fmt: skip
    baseline = kc.get_kernel_config(bucket.kernel, bucket.shape, "default")
    (r,) = reports
    assert complete and r["kernel"] == bucket.kernel and r["candidates"] == candidates, r
    assert r["config"] in (good, baseline) and len(r["rejected"]) == rejected, r
    saved = json.loads((out / "Test_GPU.json").read_text())
    assert saved["kernels"][bucket.kernel] == [{"shape": bucket.shape, "config": r["config"]}]
    monkeypatch.setenv(kc.CONFIG_DIR_ENV, str(out))
    kc.clear_config_cache()
    return r
