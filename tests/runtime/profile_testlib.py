"""A valid tuned profile for this CPU, written for tests."""

from __future__ import annotations

import torch
from pagoda.runtime.tuned_profile import SCHEMA_VERSION, device_identity, write_profile


def make_profile(folder, **overrides):
    data = {
        "schema_version": SCHEMA_VERSION,
        "device": device_identity(torch.device("cpu")),
        "model": "smollm2-135m",
        "dtype": "float32",
        "created": "2026-11-30T21:00:00Z",
        "scheduler": {"max_num_batched_tokens": 96, "max_num_seqs": 12},
        "capacity": {"prefill_tokens_per_s": 500.0, "decode_tokens_per_s": 80.0},
        **overrides,
    }
    write_profile(folder, data)
    return folder
