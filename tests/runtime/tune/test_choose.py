"""The scheduler-knob policy on synthetic curves (pure functions: no engine needed)."""

from __future__ import annotations

import pytest
from pagoda.runtime.tune.choose import Targets, choose_scheduler, fit_line

# decode step = 10 ms + 1 ms per sequence; prefill = 1 ms + 0.1 ms per token
DECODE = [{"batch": b, "context": 512, "step_s": 0.010 + 0.001 * b} for b in (1, 8, 32)]
PREFILL = [{"chunk_tokens": c, "step_s": 0.001 + 0.0001 * c} for c in (64, 256, 1024)]


def test_fit_line_recovers_intercept_and_slope():
    a, c = fit_line([(b, 0.010 + 0.001 * b) for b in (1, 8, 32)])
    assert a == pytest.approx(0.010) and c == pytest.approx(0.001)
    assert fit_line([(4, 0.02)]) == (0.02, 0.0)  # one batch size: flat


def test_itl_target_bounds_batch_and_chunk():
    choice = choose_scheduler(
        PREFILL, DECODE, kv_capacity_tokens=1 << 20, targets=Targets(itl_s=0.05), prompt_tokens=512
    )
    assert choice.max_num_seqs == 40  # (50 ms - 10 ms) / 1 ms
    # a 1024-token chunk (103.4 ms) breaks the ITL; 256 (26.6 ms) + 40 decodes (40 ms) does too;
    # 64 tokens (7.4 ms + 40 ms) fits
    assert choice.chunk_tokens == 64
    assert choice.max_num_batched_tokens == 64 + 40
    assert choice.itl_met and choice.decode_tokens_per_s == pytest.approx(40 / 0.050, rel=1e-3)
    assert choice.prefill_tokens_per_s == pytest.approx(64 / 0.0074, rel=1e-3)
    assert choice.ttft_met == (choice.max_prompt_tokens_within_ttft >= 512)


def test_kv_capacity_caps_the_batch():
    choice = choose_scheduler(
        PREFILL, DECODE, kv_capacity_tokens=512 * 6, targets=Targets(itl_s=1.0), prompt_tokens=64
    )
    assert choice.max_num_seqs == 6 and "KV" in choice.reason
    assert choice.chunk_tokens == 1024  # loose ITL: the best V_P wins


def test_unreachable_itl_serves_for_throughput_and_says_so():
    choice = choose_scheduler(
        PREFILL,
        DECODE,
        kv_capacity_tokens=512 * 100,
        targets=Targets(itl_s=0.005),
        prompt_tokens=64,
    )
    assert not choice.itl_met and "unreachable" in choice.reason
    assert choice.max_num_seqs == 96  # the KV-bound batch (100), rounded to a multiple of 8
    assert choice.chunk_tokens == 1024  # the best V_P


def test_batch_shrinks_to_make_room_for_a_chunk():
    slow_prefill = [{"chunk_tokens": 64, "step_s": 0.020}, {"chunk_tokens": 512, "step_s": 0.1}]
    choice = choose_scheduler(
        slow_prefill,
        DECODE,
        kv_capacity_tokens=1 << 20,
        targets=Targets(itl_s=0.05),
        prompt_tokens=64,
    )
    # 40 decodes (40 ms) + a 64-token chunk (20 ms) > 50 ms: 30 leave room (24: multiple of 8)
    assert choice.itl_met and choice.chunk_tokens == 64 and choice.max_num_seqs == 24


def test_targets_are_validated():
    with pytest.raises(ValueError, match="positive"):
        Targets(ttft_s=0)
    with pytest.raises(ValueError, match="at least one"):
        choose_scheduler([], DECODE, kv_capacity_tokens=1, targets=Targets(), prompt_tokens=1)
