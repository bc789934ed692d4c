"""The offline benchmark's HF configurations: parsed, checked, and trimmed only without bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import offline_throughput


def test_asked_configurations_are_parsed_in_order():
    assert offline_throughput.hf_configs(["bf16:8", "fp32:32"]) == [("bf16", 8), ("fp32", 32)]


@pytest.mark.parametrize("bad", ["fp16:8", "fp32", "fp32:0", "fp32:x"])
def test_bad_configuration_is_refused_with_the_format(bad):
    with pytest.raises(SystemExit, match="DTYPE:BATCH"):
        offline_throughput.hf_configs([bad])


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_default_drops_bf16_batch_32_only_without_native_bf16(monkeypatch, fast_bf16):
    monkeypatch.setattr(offline_throughput, "cpu_has_fast_bf16", lambda: fast_bf16)
    got = offline_throughput.hf_configs(None)
    assert got[:3] == [("fp32", 8), ("fp32", 32), ("bf16", 8)]
    assert (("bf16", 32) in got) == fast_bf16
